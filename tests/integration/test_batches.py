"""A line's `batch_size`: one queue message carries several records; the bound counts
messages; a real worker runs every record of a message."""

from __future__ import annotations

import json

import pytest

from app.clock import utcnow
from app.journal.models import RecordStatus
from app.lines import TABLE_SINK_BATCH
from tests.integration.test_overload import BOUND, POSTS_EACH, PRODUCERS, DepthSampler, flood
from tests.support.journal import journal_records, new_record
from tests.support.messages import message_args
from tests.support.processes import wait_for


def journal_enqueued(rt, payloads: list[dict], *, line: str = "order") -> list[str]:
    """A record of `line` for each payload, journaled as `enqueued` (as the intake leaves
    them before its push), oldest first."""
    return journal_records(rt, payloads, line=line, status=RecordStatus.ENQUEUED)


@pytest.mark.journal
def test_a_push_packs_records_into_messages_and_stops_at_the_bound_in_records(harness):
    harness.configure(lines__order__batch_size="8")
    rt = harness.runtime()
    ids = journal_enqueued(rt, [{"business_no": f"B-{n}"} for n in range(20)])

    # Messages of 8, 8 and 4 records: the third would make 20 records, past 19.
    outcome = rt.pusher.push("order", ids, max_length=19, batch_size=8)

    assert (outcome.pushed, outcome.depth) == (16, 16)
    assert (rt.pusher.depth("order"), rt.pusher.messages("order")) == (16, 2)
    # LPUSH: the oldest message is at the right, where the worker takes from.
    assert [message_args(m) for m in reversed(rt.redis.lrange("order", 0, -1))] == [
        ids[:8],
        ids[8:16],
    ]
    harness.start_worker("order", pool="prefork", concurrency=1)
    final = harness.wait_until_final(set(ids[:16]), timeout_s=60)
    assert {r.status for r in final.values()} == {RecordStatus.DONE}
    stored = {row[0] for row in harness.rows("SELECT business_no FROM orders")}
    assert stored == {f"B-{n}" for n in range(16)}
    assert {r.status for r in harness.records() if r.id in ids[16:]} == {RecordStatus.ENQUEUED}


def test_by_default_a_group_is_packed_on_a_table_sink_line_and_on_an_http_line(harness):
    harness.configure(
        lines__refund__downstream_url="http://127.0.0.1:9/in",
        lines__refund__deliveries_in_flight="2",
    )
    rt = harness.runtime()
    now = utcnow()
    orders = [new_record("order", f"O-{n}", now=now) for n in range(TABLE_SINK_BATCH + 2)]
    refunds = [new_record("refund", f"R-{n}", now=now) for n in range(3)]

    rt.acceptor.accept_many([*orders, *refunds], clock=utcnow)

    order_ids = [new.id for new in orders]
    assert [message_args(m) for m in reversed(rt.redis.lrange("order", 0, -1))] == [
        order_ids[:TABLE_SINK_BATCH],
        order_ids[TABLE_SINK_BATCH:],
    ]
    # An HTTP sink delivers a message's records concurrently: as many to a message as
    # its worker process keeps deliveries in flight.
    refund_ids = [new.id for new in refunds]
    assert [message_args(m) for m in reversed(rt.redis.lrange("refund", 0, -1))] == [
        refund_ids[:2],
        refund_ids[2:],
    ]


def test_a_batching_line_under_32_producers_holds_its_bound_and_finishes_everything(harness):
    harness.configure(
        lines__order__max_queue_length=str(BOUND // 10),
        lines__order__batch_size="8",
        # Every answer from its push, however loaded the machine (as test_overload.py's
        # flood): a request whose push outlived the wait, or waited for the push thread
        # longer than half the sweeper's grace, would be answered `received` (a loaded CI
        # run saw it here).
        intake_push_wait_seconds="30",
        received_grace_seconds="120",
    )
    client = harness.start_intake()
    rt = harness.runtime()
    with DepthSampler(rt.redis, "order", records=True) as sampler:
        answers = flood(str(client.base_url), "order")
    assert {a.status_code for a in answers} == {202}
    assert sampler.samples
    # The bound counts records: 10, whatever the messages of 8 carry.
    assert max(sampler.samples) <= BOUND // 10
    statuses = [a.json()["status"] for a in answers]
    assert 1 <= statuses.count("enqueued") <= BOUND // 10
    assert set(statuses) == {"enqueued", "deferred"}
    harness.start_worker("order", pool="prefork", concurrency=2)
    harness.start_beat()  # the sweeper moves the deferred ones, eight to a message
    final = harness.wait_until_final({a.json()["id"] for a in answers}, timeout_s=120)
    assert {r.status for r in final.values()} == {RecordStatus.DONE}
    assert len(harness.rows("SELECT business_no FROM orders")) == PRODUCERS * POSTS_EACH


@pytest.mark.journal
def test_a_record_the_sink_refuses_fails_alone_and_the_rest_of_its_batch_is_done(harness):
    """The records of a table-sink batch share one transaction; each one's sink write has
    its own savepoint, so one that fails rolls back alone and counts its attempt."""
    rt = harness.runtime()
    occurred = utcnow().isoformat()
    payloads = [
        {"business_no": f"S-{n}", "status": "paid", "occurred_at": occurred} for n in range(6)
    ]
    payloads.insert(2, {"business_no": "S-bad"})  # no status: the sink cannot write it
    # Longer than the status column: PostgreSQL refuses the statement, which aborts the
    # whole transaction unless the savepoint holds it; SQLite stores it.
    payloads.insert(5, {"business_no": "S-long", "status": "x" * 100, "occurred_at": occurred})
    ids = journal_enqueued(rt, payloads, line="status")
    strict = not harness.env["PIPELINE_DATABASE_URL"].startswith("sqlite")
    refused = {ids[2], ids[5]} if strict else {ids[2]}

    assert rt.pusher.push("status", ids, max_length=10, batch_size=8).pushed == 8
    harness.start_worker("status", pool="prefork", concurrency=1)

    final = harness.wait_until_final(set(ids) - refused, timeout_s=60)
    assert {(r.status, r.attempts) for r in final.values()} == {(RecordStatus.DONE, 1)}

    def failed() -> dict:
        return {r.id: r for r in harness.records() if r.status is RecordStatus.FAILED}

    wait_for(lambda: set(failed()) == refused, timeout_s=30, what="the refused records to fail")
    assert {r.attempts for r in failed().values()} == {1}
    assert "KeyError" in (failed()[ids[2]].last_error or "")
    stored = {row[0] for row in harness.rows("SELECT business_no FROM order_status")}
    assert stored == {
        p["business_no"] for p, i in zip(payloads, ids, strict=True) if i not in refused
    }


@pytest.mark.journal
def test_a_batch_writes_its_records_in_message_order_and_an_id_met_twice_runs_once(harness):
    """A whole table-sink batch is claimed, marked done and written by one statement each:
    of two records for one order, the later one's payload is what the table keeps, and an
    id that a message carries twice counts one attempt."""
    rt = harness.runtime()
    payloads = [{"business_no": f"M-{n}", "amount": n} for n in range(4)]
    payloads.append({"business_no": "M-1", "amount": 100})  # another version of M-1
    ids = journal_enqueued(rt, payloads)
    # ids[4] before ids[1]: the message's order, not the journal's; ids[0] twice.
    message = [ids[0], ids[4], ids[1], ids[2], ids[0], ids[3]]

    assert rt.pusher.push("order", message, max_length=10, batch_size=len(message)).pushed == 6
    harness.start_worker("order", pool="prefork", concurrency=1)

    final = harness.wait_until_final(set(ids), timeout_s=60)
    assert {(r.status, r.attempts) for r in final.values()} == {(RecordStatus.DONE, 1)}
    rows = harness.rows("SELECT business_no, payload FROM orders")
    # The payload column comes back as text from SQLite, parsed from PostgreSQL.
    stored = {no: json.loads(p) if isinstance(p, str) else p for no, p in rows}
    assert {no: payload["amount"] for no, payload in stored.items()} == {
        "M-0": 0,
        "M-1": 1,
        "M-2": 2,
        "M-3": 3,
    }
