"""Flower tells the truth: a real worker's task events (what Flower shows) say `failed`, with
the error, for an attempt that failed and for a record that died, and `succeeded` for a
delivery; each task names its line and business number, and Flower's search finds it by
them. The journal still owns the retries: a failed task's message is acked, never run
again by Celery."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from app.celery_app import create_celery
from app.clock import utcnow
from app.journal.models import RecordStatus
from tests.support.processes import wait_for
from tests.support.task_events import TaskEvents

PIPELINE = str(Path(sys.executable).with_name("pipeline"))
ENDED = ("task-failed", "task-succeeded")


def _fast_retries(harness, line: str, handler: str, **more: str) -> None:
    harness.configure(
        **{
            f"lines__{line}__handler": f"tests.support.handlers:{handler}",
            f"lines__{line}__backoff_initial_s": "0.05",
            f"lines__{line}__backoff_max_s": "0.2",
        },
        **{f"lines__{line}__{name}": value for name, value in more.items()},
    )


def test_two_failed_attempts_show_as_failed_tasks_with_their_errors_then_a_success(harness):
    _fast_retries(harness, "order", "fail_twice")
    harness.start_worker("order")
    celery = create_celery(harness.settings())
    try:
        with TaskEvents(celery) as events:
            client = harness.start_intake()
            harness.start_beat()  # its sweeper pushes each retry when it is due
            response = client.post("/v1/order", json={"business_no": "FLAKY-1"})
            record_id = response.json()["id"]
            events.wait_for(
                lambda _: bool(events.of_task(record_id, "task-succeeded")),
                what="the record's task to succeed",
            )
    finally:
        celery.close()

    ended = events.of_task(record_id, *ENDED)
    assert [e["type"] for e in ended] == ["task-failed", "task-failed", "task-succeeded"]
    for attempt, failed in enumerate(ended[:2], start=1):
        assert failed["exception"].startswith("AttemptFailed(")
        assert f"order FLAKY-1 (record {record_id}) attempt {attempt} failed" in failed["exception"]
        assert f"Boom: attempt {attempt} fails on purpose" in failed["exception"]
    received = events.of_task(record_id, "task-received")
    assert len(received) == 3
    assert {e["kwargs"] for e in received} == {repr({"line": "order", "business_no": "FLAKY-1"})}
    state, search = events.flower()
    assert state.tasks[record_id].state == "SUCCESS"
    assert search.matching_ids("kwargs:business_no=FLAKY-1") == {record_id}
    assert search.matching_ids("flaky-1") == {record_id}

    shown = client.get(f"/v1/records/{record_id}").json()
    assert (shown["status"], shown["attempts"]) == ("done", 3)
    assert [(a["attempt"], a["outcome"]) for a in shown["attempt_history"]] == [
        (1, "failed"),
        (2, "failed"),
        (3, "done"),
    ]
    assert [a["error_message"] for a in shown["attempt_history"]] == [
        "attempt 1 fails on purpose",
        "attempt 2 fails on purpose",
        None,
    ]
    assert {a["error_class"] for a in shown["attempt_history"][:2]} == {"Boom"}
    worker_pids = {a["worker"]["pid"] for a in shown["attempt_history"]}
    assert worker_pids == {harness.components[0].pid}  # the solo worker ran them all

    shown_by_cli = subprocess.run(
        [PIPELINE, "records", "show", record_id],
        env={**harness.env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert shown_by_cli.returncode == 0, shown_by_cli.stderr
    assert "FLAKY-1" in shown_by_cli.stdout
    assert shown_by_cli.stdout.count("Boom: attempt") == 2
    assert "done" in shown_by_cli.stdout
    unknown = subprocess.run(
        [PIPELINE, "records", "show", "01NOSUCHRECORD"],
        env=harness.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert unknown.returncode == 1
    assert "no record '01NOSUCHRECORD'" in unknown.stderr


def test_a_failed_task_is_acked_and_retried_by_the_journal_and_a_dead_record_fails(harness):
    _fast_retries(harness, "refund", "always_fail", max_attempts="2")
    worker = harness.start_worker("refund")
    rt = harness.runtime()
    celery = create_celery(harness.settings())
    try:
        with TaskEvents(celery) as events:
            client = harness.start_intake()
            record_id = client.post("/v1/refund", json={"business_no": "BAD-1"}).json()["id"]
            events.wait_for(
                lambda _: bool(events.of_task(record_id, "task-failed")), what="a failed task"
            )
            # The outcome was committed before the task failed: `failed`, its retry due later,
            # and the message acked: neither on the queue nor held by the worker.
            [record] = harness.records()
            assert (record.status, record.attempts) == (RecordStatus.FAILED, 1)
            assert record.next_attempt_at is not None
            wait_for(
                lambda: rt.redis.llen("refund") == 0 and rt.redis.hlen("unacked") == 0,
                timeout_s=10,
                what="the failed task's message to be acked",
            )
            # The retry is the journal's: the sweeper pushes it once due (no beat runs here).
            wait_for(
                lambda: rt.sweeper.sweep(now=utcnow()).enqueued.get("refund", 0) == 1,
                timeout_s=10,
                what="the sweeper to push the due retry",
            )
            events.wait_for(
                lambda _: len(events.of_task(record_id, "task-failed")) == 2,
                what="the second attempt's task to fail",
            )
    finally:
        celery.close()

    assert [e["type"] for e in events.of_task(record_id, "task-received", *ENDED)] == [
        "task-received",
        "task-failed",
        "task-received",
        "task-failed",
    ]
    died = events.of_task(record_id, "task-failed")[-1]
    assert "attempt 2 failed, record dead: Boom: attempt 2 always fails" in died["exception"]
    [record] = harness.records()
    assert (record.status, record.attempts) == (RecordStatus.DEAD, 2)
    state, _search = events.flower()
    assert state.tasks[record_id].state == "FAILURE"
    assert ast.literal_eval(state.tasks[record_id].kwargs) == {
        "line": "refund",
        "business_no": "BAD-1",
    }
    # Logged as an expected failure: one line, no traceback.
    worker.wait_for_output("raised expected: AttemptFailed(", timeout_s=10)
    assert "Traceback" not in worker.output()
