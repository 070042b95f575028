"""An operator's actions on records through the admin API, on a real Redis and journal
(and a real worker where delivery is what is checked): a retry puts a record back on its
queue, a cancel makes it final and undeliverable, neither touches a record in flight, and
each real action leaves one audit row."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from app.clock import utcnow
from app.errors import InvalidFilter
from app.journal import attempts, audit, store
from app.journal.models import RecordStatus, orders, records
from app.recovery import record_actions
from app.recovery.replay import ReplayFilter
from tests.support.journal import journal_records
from tests.support.messages import queued_ids
from tests.support.processes import wait_for

pytestmark = pytest.mark.journal


def audit_rows(rt) -> list[audit.AuditEntry]:
    with rt.journal.reading() as conn:
        return audit.newest(conn, limit=100)


def set_columns(rt, record_ids: list[str], **values) -> None:
    """A test's set-up, past every guard."""
    with rt.engine.begin() as conn:
        conn.execute(update(records).where(records.c.id.in_(record_ids)).values(**values))


def order_rows(rt) -> list[str]:
    with rt.engine.connect() as conn:
        return list(conn.execute(select(orders.c.record_id)).scalars())


def test_a_dead_record_retried_from_the_api_ends_done_with_a_real_worker(harness):
    rt = harness.runtime()
    (dead,) = journal_records(rt, [{"business_no": "D-1"}], line="order", status=RecordStatus.DEAD)
    set_columns(rt, [dead], attempts=8, last_error="ConnectError: refused", finished_at=utcnow())
    client = harness.start_intake()
    harness.start_worker("order")

    answer = client.post(f"/v1/records/{dead}/retry", json={"reason": "downstream fixed"})

    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "enqueued"
    final = harness.wait_until_final({dead}, timeout_s=20)[dead]
    assert final.status is RecordStatus.DONE
    assert final.attempts == 1  # a fresh set of attempts, as a replay gives
    assert order_rows(rt) == [dead]
    (row,) = audit_rows(rt)
    assert (row.actor, row.action, row.target, row.reason) == (
        "dev",
        audit.Action.RETRY,
        f"record:{dead}",
        "downstream fixed",
    )
    assert row.result == {"from": "dead", "to": "enqueued"}


def test_a_cancelled_record_is_never_delivered_though_its_message_is_on_the_queue(harness):
    """The intake pushed its message and had not marked it enqueued yet: the record is
    `received`, its message waits. Cancelled, the worker takes the message and does nothing."""
    rt = harness.runtime()
    (rid,) = journal_records(
        rt, [{"business_no": "C-1"}], line="order", status=RecordStatus.RECEIVED
    )
    rt.pusher.push("order", [rid], max_length=100)
    client = harness.start_intake()

    answer = client.post(f"/v1/records/{rid}/cancel", json={"reason": "customer withdrew"})

    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "cancelled"
    assert queued_ids(rt.redis, "order") == [rid]
    worker = harness.start_worker("order")
    worker.wait_for_output("record_skipped", timeout_s=15)
    wait_for(lambda: rt.redis.llen("order") == 0, timeout_s=10, what="the message taken")
    (record,) = harness.records()
    assert (record.status, record.attempts, record.lease_owner) == (RecordStatus.CANCELLED, 0, None)
    assert record.finished_at is not None
    assert order_rows(rt) == []
    (row,) = audit_rows(rt)
    assert (row.action, row.target) == (audit.Action.CANCEL, f"record:{rid}")
    assert row.reason == "customer withdrew"


def test_cancel_and_retry_refuse_a_record_in_flight_or_in_another_status(harness):
    rt = harness.runtime()
    payloads = [{"business_no": f"F-{n}"} for n in range(4)]
    on_queue, leased, done, failed = journal_records(
        rt, payloads, line="order", status=RecordStatus.RECEIVED
    )
    # Pushed in the current epoch: its message is on the queue.
    now = utcnow()
    epoch = rt.pusher.push("order", [on_queue], max_length=100).epoch
    with rt.journal.transaction() as conn:
        store.mark_enqueued(conn, [on_queue], epoch=epoch, now=now)
        # An attempt holds a live lease (an expired one would be taken over).
        assert attempts.claim_attempt(conn, leased, owner="w:1:x", lease_s=60, now=now)
    set_columns(rt, [done], status=RecordStatus.DONE.value)
    set_columns(rt, [failed], status=RecordStatus.FAILED.value)
    client = harness.start_intake()

    def cancel(rid: str):
        return client.post(f"/v1/records/{rid}/cancel", json={"reason": "r"})

    for rid in (on_queue, leased):
        answer = cancel(rid)
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"]["code"] == "record_in_flight"
    answer = cancel(done)
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "record_status_conflict"
    answer = client.post(f"/v1/records/{on_queue}/retry")
    assert (answer.status_code, answer.json()["error"]["code"]) == (409, "record_status_conflict")
    assert client.post("/v1/records/01NOPE/cancel", json={"reason": "r"}).status_code == 404
    assert client.post(f"/v1/records/{failed}/cancel", json={"reason": " "}).status_code == 422
    assert client.post(f"/v1/records/{failed}/cancel", json={}).status_code == 422

    statuses = {r.id: r.status for r in harness.records()}
    assert statuses == {
        on_queue: RecordStatus.ENQUEUED,
        leased: RecordStatus.RECEIVED,
        done: RecordStatus.DONE,
        failed: RecordStatus.FAILED,
    }
    assert audit_rows(rt) == []
    # Once its lease has expired (its worker died), the record may be cancelled.
    set_columns(rt, [leased], lease_expires_at=now - timedelta(seconds=1))
    assert cancel(leased).json()["status"] == "cancelled"


def test_bulk_cancel_dry_run_counts_and_writes_nothing_the_real_run_pages_and_audits_once(
    harness, monkeypatch
):
    monkeypatch.setattr(record_actions, "PAGE_SIZE", 2)  # several pages out of five records
    rt = harness.runtime()
    failed = journal_records(
        rt, [{"business_no": f"B-{n}"} for n in range(4)], line="order", status=RecordStatus.FAILED
    )
    (done,) = journal_records(rt, [{"business_no": "B-D"}], line="order", status=RecordStatus.DONE)
    (busy,) = journal_records(
        rt, [{"business_no": "B-E"}], line="order", status=RecordStatus.RECEIVED
    )
    with rt.journal.transaction() as conn:
        store.mark_enqueued(conn, [busy], epoch=rt.pusher.epoch(), now=utcnow())
    (other,) = journal_records(
        rt, [{"business_no": "B-R"}], line="refund", status=RecordStatus.FAILED
    )
    client = harness.start_intake()
    body = {"line": "order", "reason": "supplier gone"}

    dry = client.post("/v1/records/cancel", json=body | {"dry_run": True})

    expected = {"matched": 6, "cancelled": 4, "skipped_status": 1, "skipped_in_flight": 1}
    assert dry.status_code == 200, dry.text
    assert dry.json() == {"dry_run": True, **expected}
    assert audit_rows(rt) == []
    assert {r.status for r in harness.records() if r.id in failed} == {RecordStatus.FAILED}

    real = client.post("/v1/records/cancel", json=body)

    assert real.json() == {"dry_run": False, **expected}
    statuses = {r.id: r.status for r in harness.records()}
    assert {statuses[rid] for rid in failed} == {RecordStatus.CANCELLED}
    assert (statuses[done], statuses[busy], statuses[other]) == (
        RecordStatus.DONE,
        RecordStatus.ENQUEUED,
        RecordStatus.FAILED,
    )
    (row,) = audit_rows(rt)
    assert (row.action, row.target) == (audit.Action.CANCEL, "line:order")
    assert row.reason == "supplier gone"
    assert row.params == {"line": "order"}
    result = row.result or {}
    assert (result["matched"], result["acted"], result["skipped_in_flight"]) == (6, 4, 1)


def test_bulk_retry_pushes_within_the_bound_and_defers_the_rest(harness):
    harness.configure(
        lines__order__max_queue_length="2",
        lines__order__batch_size="1",
        lines__order__sender_queue_share="1",
    )
    rt = harness.runtime()
    dead = journal_records(
        rt, [{"business_no": f"R-{n}"} for n in range(3)], line="order", status=RecordStatus.DEAD
    )
    client = harness.start_intake()

    dry = client.post("/v1/records/retry", json={"status": ["dead"], "dry_run": True}).json()
    assert (dry["matched"], dry["retried"], dry["enqueued"]) == (3, 3, None)
    answer = client.post("/v1/records/retry", json={"status": ["dead"], "line": "order"})

    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert (got["retried"], got["enqueued"], got["deferred"]) == (3, 2, 1)
    assert queued_ids(rt.redis, "order") == sorted(dead)[:2]  # by id, as the pages go
    statuses = [r.status for r in sorted(harness.records(), key=lambda r: r.id)]
    assert statuses == [RecordStatus.ENQUEUED, RecordStatus.ENQUEUED, RecordStatus.DEFERRED]
    (row,) = audit_rows(rt)
    assert row.action is audit.Action.RETRY
    assert row.params == {"line": "order", "status": ["dead"]}


def test_a_bulk_action_needs_a_filter(harness):
    client = harness.start_intake()
    answer = client.post("/v1/records/retry", json={"dry_run": True})
    assert (answer.status_code, answer.json()["error"]["code"]) == (422, "invalid_filter")
    assert client.post("/v1/records/cancel", json={"line": "order"}).status_code == 422  # reason


@pytest.mark.parametrize("selection", [{"min_attempts": 0}, {"min_attempts": 0, "dry_run": True}])
def test_a_filter_that_selects_everything_is_no_filter(harness, selection):
    # Every record has at least 0 attempts: such a bulk action would take them all.
    rt = harness.runtime()
    journal_records(rt, [{"business_no": "A-1"}], line="order", status=RecordStatus.FAILED)
    client = harness.start_intake()
    answer = client.post("/v1/records/cancel", json=selection | {"reason": "all of them"})
    assert (answer.status_code, answer.json()["error"]["code"]) == (422, "invalid_filter")
    assert {r.status for r in harness.records()} == {RecordStatus.FAILED}


def test_empty_error_words_are_no_filter_either(harness):
    rt = harness.runtime()
    actions = record_actions.RecordActions(journal=rt.journal, pusher=rt.pusher, lines=rt.lines)
    with pytest.raises(InvalidFilter):
        actions.bulk(
            store.RecordFilter(error_text=""),
            cancel=True,
            dry_run=True,
            actor="cli:test",
            reason="all of them",
            clock=utcnow,
        )


def test_a_bulk_action_stopped_part_way_is_audited_with_what_it_did(harness, monkeypatch):
    """Ctrl-C at the command line lands in the progress bar's callback between two pages:
    the records of the pages done stay done, and the audit log says so."""
    monkeypatch.setattr(record_actions, "PAGE_SIZE", 2)
    rt = harness.runtime()
    failed = journal_records(
        rt, [{"business_no": f"S-{n}"} for n in range(5)], line="order", status=RecordStatus.FAILED
    )
    actions = record_actions.RecordActions(journal=rt.journal, pusher=rt.pusher, lines=rt.lines)

    def interrupted(_done: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        actions.bulk(
            store.RecordFilter(line="order"),
            cancel=True,
            dry_run=False,
            actor="cli:test",
            reason="supplier gone",
            clock=utcnow,
            on_page=interrupted,
        )

    statuses = sorted(r.status.value for r in harness.records() if r.id in failed)
    assert statuses == ["cancelled", "cancelled", "failed", "failed", "failed"]
    (row,) = audit_rows(rt)
    assert (row.actor, row.action, row.reason) == ("cli:test", audit.Action.CANCEL, "supplier gone")
    result = row.result or {}
    assert (result["acted"], result["error"]) == (2, "KeyboardInterrupt")


def test_a_cancelled_record_is_swept_never_and_replayed_only_when_its_status_is_named(harness):
    rt = harness.runtime()
    (rid,) = journal_records(rt, [{"business_no": "N-1"}], line="order", status=RecordStatus.FAILED)
    client = harness.start_intake()
    assert client.post(f"/v1/records/{rid}/cancel", json={"reason": "r"}).status_code == 200
    # Due by every threshold the sweeper has, were it still failed.
    set_columns(rt, [rid], next_attempt_at=utcnow() - timedelta(hours=1))

    rt.sweeper.sweep(now=utcnow() + timedelta(days=1))
    default = rt.replayer.replay(ReplayFilter(line="order"), dry_run=False, actor="t", clock=utcnow)

    assert (default.matched, queued_ids(rt.redis, "order")) == (0, [])
    assert [r.status for r in harness.records()] == [RecordStatus.CANCELLED]
    named = ReplayFilter(line="order", statuses=[RecordStatus.CANCELLED])
    counts = rt.replayer.replay(named, dry_run=False, actor="t", clock=utcnow)
    assert (counts.matched, counts.enqueued, queued_ids(rt.redis, "order")) == (1, 1, [rid])


def test_a_dead_or_rejected_record_may_be_cancelled_and_a_done_one_may_not(harness):
    rt = harness.runtime()
    dead, rejected, done = (
        journal_records(rt, [{"business_no": f"C-{status}"}], line="order", status=status)[0]
        for status in (RecordStatus.DEAD, RecordStatus.REJECTED, RecordStatus.DONE)
    )
    client = harness.start_intake()
    for record_id in (dead, rejected):
        answer = client.post(f"/v1/records/{record_id}/cancel", json={"reason": "given up"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "cancelled"
    refused = client.post(f"/v1/records/{done}/cancel", json={"reason": "too late"})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "record_status_conflict"
    assert {row.target for row in audit_rows(rt)} == {f"record:{dead}", f"record:{rejected}"}


def test_a_bulk_cancel_of_100_dead_records_cancels_them_all_with_one_audit_row(harness):
    harness.configure(admin_tokens='{"alice": "alice-token-of-24-bytes"}')
    rt = harness.runtime()
    dead = journal_records(
        rt, [{"business_no": f"X-{n}"} for n in range(100)], line="order", status=RecordStatus.DEAD
    )
    client = harness.start_intake()
    answer = client.post(
        "/v1/records/cancel",
        json={"status": ["dead"], "line": "order", "reason": "customer closed the account"},
        headers={"authorization": "Bearer alice-token-of-24-bytes"},
    )
    assert answer.status_code == 200, answer.text
    assert (answer.json()["matched"], answer.json()["cancelled"]) == (100, 100)
    statuses = {r.id: r.status for r in harness.records()}
    assert {statuses[rid] for rid in dead} == {RecordStatus.CANCELLED}
    (row,) = audit_rows(rt)
    assert (row.actor, row.action, row.target) == ("alice", audit.Action.CANCEL, "line:order")
    assert row.reason == "customer closed the account"
    assert (row.result or {})["acted"] == 100


def test_a_retry_on_a_paused_line_waits_deferred_instead_of_going_onto_its_queue(harness):
    rt = harness.runtime()
    dead = journal_records(
        rt, [{"business_no": f"P-{n}"} for n in range(3)], line="order", status=RecordStatus.DEAD
    )
    client = harness.start_intake()
    assert client.post("/v1/lines/order/pause", json={"reason": "downstream down"}).is_success

    one = client.post(f"/v1/records/{dead[0]}/retry", json={})
    bulk = client.post("/v1/records/retry", json={"line": "order", "status": ["dead"]})

    assert (one.status_code, one.json()["status"]) == (200, "deferred")
    assert (bulk.json()["retried"], bulk.json()["enqueued"], bulk.json()["deferred"]) == (2, 0, 2)
    assert queued_ids(rt.redis, "order") == []
    assert {r.status for r in harness.records()} == {RecordStatus.DEFERRED}
