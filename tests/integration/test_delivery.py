"""The whole path on real parts: intake over HTTP → journal → Redis → Celery worker → sink."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from tests.support.recorder import Recorder, StillProcessing


def test_records_posted_across_lines_all_end_done_once_per_business_no(harness):
    recorder = Recorder().start()
    try:
        # A fourth line, added by configuration only, delivers over HTTP.
        harness.configure(lines__shipment__downstream_url=f"{recorder.url}/in")
        client = harness.start_intake()
        for line in ("order", "refund", "status", "shipment"):
            harness.start_worker(line, pool="prefork", concurrency=2)
        ids: dict[str, set[str]] = {
            "order": set(),
            "refund": set(),
            "status": set(),
            "shipment": set(),
        }
        base = datetime(2026, 1, 1, tzinfo=UTC)
        for n in range(300):
            line = ("order", "refund", "status")[n % 3]
            # Every business number is posted twice: the tables must still hold one row each.
            payload: dict[str, object] = {"business_no": f"{line[:1].upper()}-{n % 50}", "n": n}
            if line == "status":
                payload |= {
                    "status": f"s{n}",
                    "occurred_at": (base + timedelta(minutes=n)).isoformat(),
                }
            response = client.post(f"/v1/{line}", json=payload)
            assert response.status_code == 202, response.text
            assert response.json()["status"] == "enqueued"
            ids[line].add(response.json()["id"])
        for n in range(30):
            response = client.post("/v1/shipment", json={"business_no": f"SH-{n}"})
            assert response.status_code == 202, response.text
            ids["shipment"].add(response.json()["id"])

        every_id = set().union(*ids.values())
        final = harness.wait_until_final(every_id, timeout_s=120)
        assert {r.status.value for r in final.values()} == {"done"}
        assert all(r.attempts == 1 for r in final.values())

        for table, line in (("orders", "order"), ("refunds", "refund"), ("order_status", "status")):
            rows = harness.rows(f"SELECT business_no, record_id FROM {table}")  # noqa: S608
            business_nos = [row[0] for row in rows]
            assert len(business_nos) == len(set(business_nos)) == 50, table
            assert {row[1] for row in rows} <= ids[line]

        seen = recorder.snapshot()
        assert {r.body["id"] for r in seen} == ids["shipment"]
        assert all(r.headers["Idempotency-Key"] == r.body["id"] for r in seen)
        assert all(r.path == "/in" and r.body["line"] == "shipment" for r in seen)
    finally:
        recorder.stop()


@pytest.mark.journal
def test_status_sequence_delivered_out_of_order_ends_at_newest(harness):
    client = harness.start_intake()
    base = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    steps = [(f"step-{n}", base + timedelta(seconds=n)) for n in range(12)]
    shuffled = steps[:]
    random.Random(7).shuffle(shuffled)
    assert shuffled[-1] != steps[-1]  # the newest does not simply arrive last
    ids = set()
    for status, occurred_at in shuffled:
        body = {"business_no": "ORD-9", "status": status, "occurred_at": occurred_at.isoformat()}
        response = client.post("/v1/status", json=body)
        assert response.status_code == 202, response.text
        ids.add(response.json()["id"])
    harness.start_worker("status")
    harness.wait_until_final(ids)
    rows = harness.rows("SELECT business_no, status FROM order_status")
    assert [tuple(row) for row in rows] == [("ORD-9", "step-11")]


@pytest.mark.journal
def test_failing_twice_then_succeeding_ends_done_after_three_attempts(harness):
    harness.configure(
        lines__order__handler="tests.support.handlers:fail_twice",
        lines__order__backoff_initial_s="0.05",
        lines__order__backoff_max_s="0.2",
    )
    client = harness.start_intake()
    harness.start_worker("order")
    harness.start_beat()  # its sweeper re-enqueues the failed attempts when their retry is due
    response = client.post("/v1/order", json={"business_no": "FLAKY-1"})
    assert response.status_code == 202
    record_id = response.json()["id"]
    final = harness.wait_until_final({record_id})[record_id]
    assert final.status.value == "done"
    assert final.attempts == 3
    assert final.last_error is None


def test_always_failing_handler_ends_dead_after_max_attempts(harness):
    harness.configure(
        lines__refund__handler="tests.support.handlers:always_fail",
        lines__refund__max_attempts="4",
        lines__refund__backoff_initial_s="0.05",
        lines__refund__backoff_max_s="0.2",
    )
    client = harness.start_intake()
    worker = harness.start_worker("refund")
    harness.start_beat()
    response = client.post("/v1/refund", json={"business_no": "BAD-1"})
    record_id = response.json()["id"]
    final = harness.wait_until_final({record_id})[record_id]
    assert final.status.value == "dead"
    assert final.attempts == 4
    assert final.finished_at is not None
    assert "always fails" in (final.last_error or "")
    # The worker logs after it commits: give its log line a moment to land.
    worker.wait_for_output("alert=TASK_DEAD", timeout_s=10)
    output = worker.output()
    assert output.count("record_dead") == 1
    assert "alert=TASK_DEAD" in output


def test_a_409_for_a_post_still_in_progress_downstream_is_not_delivered(harness):
    """The downstream holds our first POST past our timeout and then fails it; meanwhile it
    answers our retries (same Idempotency-Key) 409, "still processing". It never accepted
    the record, so the record must not end `done`."""
    downstream = StillProcessing(hold_s=60).start()
    try:
        harness.configure(
            lines__refund__downstream_url=f"{downstream.url}/refunds",
            lines__refund__delivery_timeout_s="0.5",
            lines__refund__max_attempts="3",
            lines__refund__backoff_initial_s="0.05",
            lines__refund__backoff_max_s="0.2",
        )
        client = harness.start_intake()
        harness.start_worker("refund")
        harness.start_beat()  # its sweeper re-enqueues the failed attempts
        response = client.post("/v1/refund", json={"business_no": "R-409"})
        assert response.status_code == 202, response.text
        record_id = response.json()["id"]
        final = harness.wait_until_final({record_id})[record_id]
        answers = [
            r.answered
            for r in downstream.snapshot()
            if r.headers.get("Idempotency-Key") == record_id
        ]
        assert final.status.value == "dead", (final.status, final.attempts, answers)
        assert final.attempts == 3
        assert "HTTP 409" in (final.last_error or "")
        assert 409 in answers  # a retry met the first POST still in progress
        assert not [a for a in answers if 200 <= a < 300]
    finally:
        downstream.stop()


def test_a_409_is_delivered_where_the_line_counts_it_as_delivered(harness):
    downstream = Recorder(status=409).start()
    try:
        harness.configure(
            lines__refund__downstream_url=f"{downstream.url}/refunds",
            lines__refund__delivered_statuses="2xx,409",
        )
        client = harness.start_intake()
        harness.start_worker("refund")
        response = client.post("/v1/refund", json={"business_no": "R-409-OK"})
        assert response.status_code == 202, response.text
        record_id = response.json()["id"]
        final = harness.wait_until_final({record_id})[record_id]
        assert (final.status.value, final.attempts) == ("done", 1)
        assert [r.answered for r in downstream.snapshot()] == [409]
    finally:
        downstream.stop()
