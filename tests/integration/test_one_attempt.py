"""One attempt at a time: whichever path starts a run of a record (a worker taking a
second message, a replay, the sweeper, the intake under caller_runs), no two runs of one
record overlap, and a record delivered once is not run again."""

from __future__ import annotations

import threading

import pytest

from app.admission.push import Pusher
from app.clock import utcnow
from app.recovery.replay import ReplayFilter
from tests.support.processes import wait_for
from tests.support.runs import overlapping, runs_by_record, use_runs_log

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal


def test_a_second_message_and_a_replay_never_start_a_second_run_of_a_record_in_flight(
    harness, tmp_path
):
    log = use_runs_log(harness, tmp_path)
    client = harness.start_intake()
    harness.start_worker("order", pool="prefork", concurrency=3)
    rt = harness.runtime()
    ids = set()
    for n in range(2):
        response = client.post("/v1/order", json={"business_no": f"ONE-{n}", "sleep_s": 3})
        assert response.status_code == 202, response.text
        ids.add(response.json()["id"])
    first = min(ids)
    wait_for(lambda: first in runs_by_record(log), timeout_s=30, what="the first run to start")

    # A second message of a record in flight (a restore, a retried push), then a replay
    # with its default statuses while both records are in flight.
    Pusher(rt.redis).push("order", [first], max_length=100)
    counts = rt.replayer.replay(
        ReplayFilter(line="order"), dry_run=False, actor="test", clock=utcnow
    )

    final = harness.wait_until_final(ids, timeout_s=60)
    assert {r.status.value for r in final.values()} == {"done"}
    runs = runs_by_record(log)
    assert overlapping(runs) == {}, runs
    assert {record_id: len(spans) for record_id, spans in runs.items()} == dict.fromkeys(ids, 1)
    assert counts.enqueued == 0, counts  # both were in flight: replay pushed neither


def test_a_record_the_intake_runs_under_caller_runs_is_not_swept_onto_a_worker(harness, tmp_path):
    log = use_runs_log(harness, tmp_path)
    # Room for the two records the workers hold (counted until acked) and one waiting.
    harness.configure(
        lines__order__overflow="caller_runs",
        lines__order__max_queue_length="3",
        lines__order__sender_queue_share="1",
    )
    client = harness.start_intake()
    harness.start_worker("order", pool="prefork", concurrency=2)
    harness.start_beat()  # its sweeper pushes `received` records past their grace period

    # Both worker processes busy for 4 s, then one record waiting: the queue is full.
    busy = [
        client.post("/v1/order", json={"business_no": f"BUSY-{n}", "sleep_s": 4}).json()["id"]
        for n in range(2)
    ]
    wait_for(lambda: set(busy) <= set(runs_by_record(log)), timeout_s=30, what="both workers busy")
    waiting = client.post("/v1/order", json={"business_no": "WAIT", "sleep_s": 0.1}).json()
    assert waiting["status"] == "enqueued"

    # The queue is full: this one is run by the intake, for 7 s, while the workers free up.
    answers: list[dict] = []
    caller = threading.Thread(
        target=lambda: answers.append(
            client.post("/v1/order", json={"business_no": "CALLER", "sleep_s": 7}).json()
        ),
        daemon=True,
    )
    caller.start()
    caller.join(timeout=40)
    assert not caller.is_alive(), "the caller-run request did not answer"
    assert answers[0]["status"] == "done", answers

    ids = {*busy, waiting["id"], answers[0]["id"]}
    final = harness.wait_until_final(ids, timeout_s=60)
    assert {r.status.value for r in final.values()} == {"done"}
    runs = runs_by_record(log)
    assert overlapping(runs) == {}, runs
    assert len(runs[answers[0]["id"]]) == 1, runs[answers[0]["id"]]
