"""An HTTP-sink line's worker keeps many deliveries in flight: the records of a message go
out concurrently, each with its own lease, attempt and outcome."""

from __future__ import annotations

import pytest

from tests.support.downstream import Gauged, post_records
from tests.support.processes import wait_for

pytestmark = pytest.mark.journal


def test_slow_records_hold_no_other_records_outcome(harness):
    downstream = Gauged(hold_s=60).start()
    try:
        harness.configure(
            lines__shipment__downstream_url=f"{downstream.url}/in",
            # Past the 60 s hold, within the lease (114 s, with the wait for room).
            lines__shipment__delivery_timeout_s="80",
        )
        client = harness.start_intake()
        # More slow records than the line has worker processes (`concurrency`, 4): before,
        # each held a process, and the other records waited behind them.
        slow = post_records(client, "shipment", 5, "SLOW")
        downstream.held |= slow
        others = post_records(client, "shipment", 15, "FAST")
        harness.start_worker("shipment", pool=None, concurrency=None)  # the line's defaults
        final = harness.wait_until_final(others, timeout_s=60)
        assert {record.status.value for record in final.values()} == {"done"}
        stuck = [r for r in harness.records() if r.id in slow]
        assert {r.status.value for r in stuck} == {"enqueued"}  # still in flight
        assert all(r.lease_owner is not None for r in stuck)
        # The five are in flight together (four processes held four at most).
        wait_for(lambda: downstream.in_flight == 5, timeout_s=30, what="5 held deliveries")
        downstream.release()
        assert {r.status.value for r in harness.wait_until_final(slow).values()} == {"done"}
        rows = harness.rows("SELECT record_id, attempt, outcome FROM record_attempts")
        assert sorted(row[0] for row in rows) == sorted(others | slow)  # one attempt each
        assert {row[2] for row in rows} == {"done"}
    finally:
        downstream.release()
        downstream.stop()


def test_first_attempts_that_time_out_do_not_queue_the_retries_behind_them(harness):
    """20 records toward a downstream that hangs every first attempt: the line's worker
    keeps all their first attempts in flight at once (before, four at a time, so the first
    retry began only after five rounds of timeouts), each times out after the line's
    `delivery_timeout_s`, and the retries deliver them."""
    downstream = Gauged(hold_s=30).start()
    downstream.hold_first = True
    try:
        harness.configure(
            lines__shipment__downstream_url=f"{downstream.url}/in",
            lines__shipment__delivery_timeout_s="5",
            lines__shipment__deliveries_in_flight="20",
            # Timeouts of every first attempt would open the line's circuit (its own test).
            lines__shipment__circuit_min_attempts="1000",
            lines__shipment__backoff_initial_s="0.2",
            lines__shipment__backoff_max_s="0.5",
            sweep_interval_seconds="1",
        )
        client = harness.start_intake()
        ids = post_records(client, "shipment", 20, "HANG")
        harness.start_worker("shipment", pool=None, concurrency=None)  # the line's defaults
        harness.start_beat()
        final = harness.wait_until_final(ids, timeout_s=90)
        assert {record.status.value for record in final.values()} == {"done"}
        assert {record.attempts for record in final.values()} == {2}
        # All 20 first attempts went out before the first of them timed out.
        assert downstream.first_attempts_within(5.0) == 20
        rows = harness.rows("SELECT outcome, count(*) FROM record_attempts GROUP BY outcome")
        assert {row[0]: row[1] for row in rows} == {"timeout": 20, "done": 20}
    finally:
        downstream.release()
        downstream.stop()
