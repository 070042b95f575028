"""Pausing a line: the journal holds the pause; the intake defers, the sweeper pushes
nothing and workers start no attempt of the line's records until it is resumed."""

from __future__ import annotations

import json
import time

import pytest

from app.admission.pause import hold_back
from app.clock import utcnow
from app.journal import attempts, audit, store
from app.journal.models import RecordStatus, Source
from app.journal.store import NewRecord
from tests.support.downstream import Gauged
from tests.support.journal import journal_records
from tests.support.metrics import metric, samples
from tests.support.processes import wait_for
from tests.support.runs import runs_by_record, use_runs_log

ALICE = "alice-token-0123456789"
ADMIN = {"authorization": f"Bearer {ALICE}"}
# A pause takes hold within 2 s everywhere (each process reads the journal's pauses at
# most a second apart).
TAKES_HOLD_S = 2.0


def _new(line: str, n: int) -> NewRecord:
    return NewRecord(
        id=store_id(n),
        line=line,
        business_no=f"P-{n}",
        source=Source.INTAKE,
        dedup_key=f"t:{line}:{n}",
        body_sha256="0" * 64,
        payload={"business_no": f"P-{n}"},
    )


def store_id(n: int) -> str:
    return f"01J0000000000000000000{n:04d}"


def rt_depth(harness) -> int:
    return harness.runtime().pusher.depth("order")


def _line_row(client, line: str) -> dict:
    rows = client.get("/v1/lines").json()["lines"]
    return next(row for row in rows if row["line"] == line)


@pytest.mark.journal
def test_pause_and_resume_are_admin_actions_audited_and_shown(harness):
    harness.configure(admin_tokens=json.dumps({"alice": ALICE}))
    client = harness.start_intake()
    assert client.post("/v1/lines/order/pause").status_code == 401
    assert client.post("/v1/lines/nope/pause", headers=ADMIN).status_code == 404
    assert client.post("/v1/lines/order/pause", json={"x": 1}, headers=ADMIN).status_code == 422

    paused = client.post("/v1/lines/order/pause", json={"reason": "downstream up"}, headers=ADMIN)
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True
    assert paused.json()["changed"] is True
    assert paused.json()["pause"]["by"] == "alice"
    again = client.post("/v1/lines/order/pause", headers=ADMIN).json()
    assert (again["changed"], again["pause"]["reason"]) == (False, "downstream up")

    row = _line_row(client, "order")
    assert row["paused"] is True
    assert row["pause"]["reason"] == "downstream up"
    assert _line_row(client, "refund")["paused"] is False
    metrics = samples(client.get("/metrics").text)
    assert metric(metrics, "pipeline_line_paused", line="order") == 1
    assert metric(metrics, "pipeline_line_paused", line="refund") == 0

    harness.env["COLUMNS"] = "200"  # one table row per line, however narrow the terminal
    status = harness.run("status")
    assert status.process is not None
    assert status.process.wait(timeout=30) == 0, status.output()
    assert "paused by alice" in status.output()

    # The command line pauses and resumes the same state, as `cli:<user>`.
    cli = harness.run("resume", "order", "--reason", "done with it")
    assert cli.process is not None
    assert cli.process.wait(timeout=30) == 0, cli.output()
    assert "order: running" in cli.output()
    assert client.post("/v1/lines/order/resume", headers=ADMIN).json()["changed"] is False
    assert _line_row(client, "order")["paused"] is False

    rows = list(reversed(client.get("/v1/audit", headers=ADMIN).json()["items"]))
    cli_actor = audit.cli_actor()
    assert [(r["action"], r["actor"], r["target"]) for r in rows] == [
        ("pause", "alice", "line:order"),
        ("pause", "alice", "line:order"),
        ("resume", cli_actor, "line:order"),
        ("resume", "alice", "line:order"),
    ]
    assert (rows[0]["reason"], rows[2]["reason"]) == ("downstream up", "done with it")
    assert [r["result"]["changed"] for r in rows] == [True, False, True, False]


@pytest.mark.journal
def test_a_paused_line_is_deferred_at_intake_swept_by_nobody_and_held_back_by_workers(harness):
    harness.configure(lines__order__batch_size="1")
    rt = harness.runtime()
    now = utcnow()
    with rt.journal.transaction() as conn:
        store.insert_records(conn, [_new("order", n) for n in range(4)], now=now)
        store.mark_enqueued(conn, [store_id(0), store_id(3)], epoch="e", now=now)
        # Record 3 is in flight: an attempt holds its lease.
        taken = attempts.claim_attempt(conn, store_id(3), owner="w", lease_s=60, now=now)
        assert taken is not None
    rt.pauser.pause("order", actor="t", reason=None, now=now)

    # A worker took records of a paused line: enqueued and received ones wait in the
    # journal; one in flight under another attempt's lease is left to that attempt.
    with rt.journal.transaction("holding back") as conn:
        held = hold_back(conn, [store_id(n) for n in range(4)], now=utcnow())
    assert held == 3
    # The intake journals new records of the paused line as deferred, pushing nothing.
    accepted = rt.acceptor.accept(_new("order", 10), clock=utcnow)
    other = rt.acceptor.accept(_new("refund", 11), clock=utcnow)
    assert (accepted.status, other.status) == (RecordStatus.DEFERRED, RecordStatus.ENQUEUED)
    assert rt.pusher.depth("order") == 0

    # The sweeper and the lost-message check push nothing of it, however old.
    later = utcnow().replace(year=now.year + 1)
    result = rt.sweeper.sweep(now=later)
    assert result.enqueued.get("order") is None
    assert rt.lost.recover_lost(now=later) == {}
    assert rt.pusher.depth("order") == 0

    rt.pauser.resume("order", actor="t", reason=None, now=utcnow())
    # New records after the resume wait behind those that waited while it was paused.
    after = rt.acceptor.accept(_new("order", 12), clock=utcnow)
    assert after.status is RecordStatus.DEFERRED
    rt.sweeper.sweep(now=utcnow())
    with rt.journal.reading() as conn:
        statuses = {
            r.id: r.status for r in store.find_records(conn, store.RecordFilter(), limit=9).items
        }
    assert statuses.pop(store_id(3)) is RecordStatus.ENQUEUED  # still its attempt's
    assert {s for i, s in statuses.items() if i != store_id(11)} == {RecordStatus.ENQUEUED}
    # Pushed oldest first (LPUSH: the oldest is at the tail, where workers take from).
    queued = [json.loads(m)["headers"]["id"] for m in reversed(rt.redis.lrange("order", 0, -1))]
    assert queued == [store_id(0), store_id(1), store_id(2), store_id(10), store_id(12)]
    # The pass found nothing left: new records go straight onto the queue again.
    assert rt.acceptor.accept(_new("order", 13), clock=utcnow).status is RecordStatus.ENQUEUED


def test_a_pause_holds_through_restarts_and_a_resume_delivers_in_journal_order(harness, tmp_path):
    log = use_runs_log(harness, tmp_path)
    harness.configure(sweep_interval_seconds="0.3")
    client = harness.start_intake()
    worker = harness.start_worker("order")
    beat = harness.start_beat()

    def post(n: int, sleep_s: float = 0.3) -> dict:
        answer = client.post("/v1/order", json={"business_no": f"R-{n}", "sleep_s": sleep_s})
        assert answer.status_code == 202, answer.text
        return answer.json()

    # A queue of work: one runs while the rest wait on the queue for the worker.
    before = [post(n)["id"] for n in range(6)]
    wait_for(lambda: runs_by_record(log), timeout_s=15, what="the first run to start")
    assert client.post("/v1/lines/order/pause", json={"reason": "test"}).status_code == 200
    paused_at = time.time()
    while_paused = [post(n) for n in range(6, 10)]
    assert {a["status"] for a in while_paused} == {"deferred"}

    def held_back() -> bool:
        statuses = {r.status for r in harness.records()}
        return RecordStatus.ENQUEUED not in statuses and RecordStatus.RECEIVED not in statuses

    # The worker takes what waited on the queue and holds it back in the journal.
    wait_for(held_back, timeout_s=10, what="the queued records to be held back")
    assert rt_depth(harness) == 0
    # Logged once the hold is written: read from the worker's pipe a moment later.
    wait_for(
        lambda: "records_held_line_paused" in worker.output(),
        timeout_s=5,
        what="the worker to say it held the records back",
    )

    # Restart the worker and the beat, and empty Redis, while the line is paused.
    worker.stop(timeout_s=10)
    beat.stop(timeout_s=10)
    harness.runtime().redis.flushall()
    worker = harness.start_worker("order")
    beat = harness.start_beat()
    assert _line_row(client, "order")["paused"] is True
    # A paused line's worker is live, not stalled: it takes what comes and holds it back.
    wait_for(
        lambda: _line_row(client, "order")["live_workers"] == 1,
        timeout_s=5,
        what="the restarted worker's heartbeat",
    )
    time.sleep(1.0)  # the restarted worker and beat have read the pause and swept
    late = [
        run
        for runs in runs_by_record(log).values()
        for run in runs
        if run[0] > paused_at + TAKES_HOLD_S
    ]
    assert late == [], "an attempt started on a paused line"
    records = {r.id: r for r in harness.records()}
    assert len(records) == 10
    waiting = sorted(i for i, r in records.items() if r.status is not RecordStatus.DONE)
    assert {records[i].status for i in waiting} == {RecordStatus.DEFERRED}
    assert len(waiting) >= 4
    assert set(waiting) & set(before), "no record taken from the queue was held back"

    resumed = client.post("/v1/lines/order/resume")
    assert resumed.json()["changed"] is True
    after = [post(n, sleep_s=0.05)["id"] for n in range(10, 12)]
    final = harness.wait_until_final({*before, *(a["id"] for a in while_paused), *after})
    assert {r.status for r in final.values()} == {RecordStatus.DONE}

    runs = runs_by_record(log)
    assert {len(spans) for spans in runs.values()} == {1}, "a record ran twice"
    started = sorted(runs, key=lambda record_id: runs[record_id][0][0])
    # What waited while paused starts in journal order, and nothing new overtakes it.
    resumed_order = [i for i in started if i in waiting or i in after]
    assert resumed_order == [*waiting, *sorted(after)]


def test_a_paused_line_takes_in_records_and_two_workers_deliver_none_until_resumed(
    harness, tmp_path
):
    log = use_runs_log(harness, tmp_path)
    harness.configure(sweep_interval_seconds="0.3")
    client = harness.start_intake()
    harness.start_worker("order")
    harness.start_worker("order")
    harness.start_beat()
    assert client.post("/v1/lines/order/pause").status_code == 200
    paused_at = time.time()
    answers = [
        client.post("/v1/order", json={"business_no": f"T-{n}", "sleep_s": 0.01}).json()
        for n in range(20)
    ]
    assert {a["status"] for a in answers} == {"deferred"}
    # Two processes, each past a pause's 2 s to take hold: neither starts an attempt.
    time.sleep(TAKES_HOLD_S + 1.0)
    assert runs_by_record(log) == {}
    assert {r.status for r in harness.records()} == {RecordStatus.DEFERRED}
    assert time.time() - paused_at >= TAKES_HOLD_S
    assert client.post("/v1/lines/order/resume").status_code == 200
    final = harness.wait_until_final({a["id"] for a in answers}, timeout_s=60)
    assert {r.status for r in final.values()} == {RecordStatus.DONE}
    runs = runs_by_record(log)
    assert set(runs) == {a["id"] for a in answers}
    assert {len(spans) for spans in runs.values()} == {1}, "a record ran twice"
    assert len({pid for spans in runs.values() for (_s, _e, pid) in spans}) == 2


def test_messages_on_a_paused_lines_queue_are_held_back_by_two_real_workers(harness, tmp_path):
    """The messages were on the queue before the pause took hold: the two workers take
    them and start no attempt; after the resume each record runs once."""
    log = use_runs_log(harness, tmp_path)
    harness.configure(sweep_interval_seconds="0.3")
    rt = harness.runtime()
    client = harness.start_intake()
    assert client.post("/v1/lines/order/pause").status_code == 200
    payloads = [{"business_no": f"Q-{n}", "sleep_s": 0.01} for n in range(20)]
    ids = journal_records(rt, payloads, line="order", status=RecordStatus.RECEIVED)
    rt.pusher.push("order", ids, max_length=100)
    time.sleep(TAKES_HOLD_S)
    harness.start_worker("order")
    harness.start_worker("order")
    harness.start_beat()

    # Both workers drain the queue and hold every record back in the journal.
    wait_for(lambda: rt_depth(harness) == 0, timeout_s=30, what="the queue drained")
    time.sleep(1.0)
    assert runs_by_record(log) == {}
    assert RecordStatus.DONE not in {r.status for r in harness.records()}

    assert client.post("/v1/lines/order/resume").status_code == 200
    final = harness.wait_until_final(set(ids), timeout_s=60)
    assert {r.status for r in final.values()} == {RecordStatus.DONE}
    runs = runs_by_record(log)
    assert set(runs) == set(ids)
    assert {len(spans) for spans in runs.values()} == {1}, "a record ran twice"


def test_a_pause_stops_a_message_already_running_from_claiming_more(harness):
    """One message of 20 records on a line with two deliveries in flight toward a downstream
    that takes a second: a pause in the middle stops its claims within 2 s; what it had
    not claimed waits, and is delivered after the resume, each record once."""
    downstream = Gauged(delay_s=1.0).start()
    try:
        harness.configure(
            lines__shipment__downstream_url=f"{downstream.url}/in",
            lines__shipment__deliveries_in_flight="2",
            lines__shipment__batch_size="20",
            sweep_interval_seconds="0.5",
        )
        client = harness.start_intake()
        assert client.post("/v1/lines/shipment/pause").is_success
        ids = {
            client.post("/v1/shipment", json={"business_no": f"RUN-{n}"}).json()["id"]
            for n in range(20)
        }
        harness.start_worker("shipment", pool=None, concurrency=None)
        harness.start_beat()
        assert client.post("/v1/lines/shipment/resume").is_success
        wait_for(lambda: len(downstream.arrivals) >= 2, timeout_s=30, what="deliveries")
        assert client.post("/v1/lines/shipment/pause").is_success
        paused_at = time.time()
        time.sleep(TAKES_HOLD_S + 3)  # the pause's time to hold, and two more deliveries' worth
        late = [at for at, _attempt in downstream.arrivals if at > paused_at + TAKES_HOLD_S]
        assert late == [], f"{len(late)} deliveries started more than 2 s after the pause"
        delivered = len(downstream.arrivals)
        assert delivered < 20
        waiting = [r for r in harness.records() if r.status is not RecordStatus.DONE]
        assert len(waiting) == 20 - delivered
        assert {r.status for r in waiting} == {RecordStatus.DEFERRED}

        assert client.post("/v1/lines/shipment/resume").is_success
        final = harness.wait_until_final(ids, timeout_s=60)
        assert {r.status for r in final.values()} == {RecordStatus.DONE}
        keys = sorted(r.headers["Idempotency-Key"] for r in downstream.snapshot())
        assert keys == sorted(ids)
    finally:
        downstream.stop()
