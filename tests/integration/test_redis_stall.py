"""A Redis that stops answering mid-load, past the attempts' lease, then goes on: each record
is still POSTed to its downstream once.

The attempt engine asks Redis around every HTTP delivery (its line's circuit before the
claim and after the outcome; the line's delivery limits likewise). A delivery that has
landed must have its outcome committed to the journal within its lease (95 % of
PIPELINE_VISIBILITY_TIMEOUT_SECONDS), whatever Redis does: past the lease the sweeper takes
the record again (clearing the lease, so that the late outcome is ignored) and pushes it,
and the downstream gets it a second time.

Scaled down from the issue's case (Redis stopped for 150 s against the default 120 s
visibility timeout, a 114 s lease) so that it runs in about a minute: a 24 s visibility
timeout (a 22.8 s lease) and a stall of 32 s, longer than the lease of every delivery it
catches in flight."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from app.local.embedded_redis import RedisServer
from tests.support.downstream import Gauged, post_records
from tests.support.harness import Harness
from tests.support.processes import free_port, wait_for

pytestmark = pytest.mark.journal

LINE = "shipment"
# A lease of 22.8 s (95 %): the stall below outlasts it.
VISIBILITY_TIMEOUT_S = 24
# Longer than the lease by more than the sweeper's interval and the worker's fetch: the
# leases of the deliveries it catches lapse while Redis is stopped.
STALL_S = 32.0
# Deliveries in flight when Redis stops: every record, held by the downstream until then.
RECORDS = 100
# A delivery's deadline: the longest a held delivery waits for the stall (the records reach
# the downstream within a few seconds of the worker's start), within the lease with the
# wait for room (22.8 / 4 + 12 + 1 = 18.7 s).
DELIVERY_TIMEOUT_S = 12
# The active beat's lock outlasts the stall: its sweeper goes on the moment Redis answers
# again, as it does after any stall shorter than the lock's TTL (with the default 10 s, a
# beat that lost its lock waits for a tick to take it again and one sweep interval more).
BEAT_LOCK_TTL_S = 60
# Far above the records in flight: the limits grant every ask, and each delivery holds a
# slot, given back (a Redis round trip) before its outcome is committed.
DELIVERY_CONCURRENCY = 1000


@pytest.mark.long
def test_redis_stalled_past_the_lease_posts_each_key_once(
    harness: Harness, tmp_path: Path
) -> None:
    server = RedisServer(port=free_port(), workdir=tmp_path / "redis")
    server.start()
    pid = server.pid
    assert pid is not None
    downstream = Gauged(hold_s=DELIVERY_TIMEOUT_S).start()
    stopped = False
    try:
        harness.configure(
            redis_url=server.url,
            visibility_timeout_seconds=str(VISIBILITY_TIMEOUT_S),
            beat_lock_ttl_seconds=str(BEAT_LOCK_TTL_S),
            **{
                f"lines__{LINE}__downstream_url": f"{downstream.url}/in",
                f"lines__{LINE}__delivery_timeout_s": str(DELIVERY_TIMEOUT_S),
                f"lines__{LINE}__delivery_concurrency": str(DELIVERY_CONCURRENCY),
            },
        )
        client = harness.start_intake()
        ids = post_records(client, LINE, RECORDS, "STALL")
        # Every first delivery waits at the downstream until Redis has stopped: their
        # outcomes all land while it does not answer.
        downstream.held |= ids
        harness.start_beat()
        harness.start_worker(LINE, pool=None, concurrency=None)  # the line's defaults
        wait_for(
            lambda: downstream.in_flight == RECORDS,
            timeout_s=DELIVERY_TIMEOUT_S - 2,
            what=f"{RECORDS} deliveries in flight",
        )

        os.kill(pid, signal.SIGSTOP)
        stopped = True
        stalled_at = time.monotonic()
        downstream.release()
        wait_for(
            lambda: len(downstream.snapshot()) >= RECORDS,
            timeout_s=STALL_S / 2,
            what="the held deliveries answered while Redis is stopped",
        )
        # The fault itself lasts a set time: a Redis stopped this long, then going on.
        time.sleep(max(0.0, stalled_at + STALL_S - time.monotonic()))
        os.kill(pid, signal.SIGCONT)
        stopped = False

        final = harness.wait_until_final(ids, timeout_s=60)
        posted = Counter(r.headers.get("Idempotency-Key") for r in downstream.snapshot())
        twice = {key: count for key, count in posted.items() if count > 1}
        outcomes = harness.rows("SELECT outcome, count(*) FROM record_attempts GROUP BY outcome")
        assert twice == {}, f"attempts by outcome: {dict((row[0], row[1]) for row in outcomes)}"
        assert set(posted) == ids
        assert {r.status.value for r in final.values()} == {"done"}
        # One attempt each, its outcome committed while its lease was held.
        assert {row[0]: row[1] for row in outcomes} == {"done": RECORDS}
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)
        downstream.release()
        downstream.stop()
        server.stop()
