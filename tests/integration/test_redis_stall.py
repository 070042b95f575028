"""A Redis that stops answering mid-load, past the attempts' lease, then goes on: each record
is still POSTed to its downstream once.

The attempt engine asks Redis around every HTTP delivery: its line's circuit (before the
claim, and to count the outcome) and its delivery limits (a slot asked for, then given
back). A delivery that has landed must have its outcome committed to the journal within
its lease (95 % of PIPELINE_VISIBILITY_TIMEOUT_SECONDS) whatever Redis does: past the lease
the sweeper takes the record again (clearing the lease, so that the late outcome is
ignored) and pushes it, and the downstream gets it a second time.

Scaled down from the issue's case (Redis stopped for 150 s under load against the default
120 s visibility timeout, a 114 s lease) so that it runs in under a minute: a 24 s
visibility timeout (a 22.8 s lease) and a stall of 32 s, longer than the lease of every
delivery it catches in flight (all the records, held by the downstream until Redis has
stopped, so that every outcome lands while it does not answer).

Once Redis answers again, a late outcome races the sweeper. The test gives the sweeper its
best chance, as a beat can have it: it takes the lapsed records as soon as Redis answers
(its lock outlasts the stall, no other maintenance job shares its thread, and each Redis
call fails after its two socket timeouts instead of waiting out the stall), and enough
deliveries are in flight that the worker's backlog of Redis calls takes longer than that to
drain. An engine that commits each outcome within its lease whatever Redis does wins that
race before it starts."""

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

# What it checks is the engine's and Redis's, not the journal's database: the SQLite pass only.
pytestmark = pytest.mark.journal_independent

LINE = "shipment"
# A lease of 22.8 s (95 %): the stall below outlasts it.
VISIBILITY_TIMEOUT_S = 24
# Longer than the lease: the deliveries it catches were claimed a few seconds before it
# began, so each one's lease lapses while Redis is stopped.
STALL_S = 32.0
# Deliveries in flight when Redis stops: every record, held by the downstream until then
# (the line's worker keeps them all in flight: `deliveries_in_flight`, and as many threads).
RECORDS = 300
# A delivery's deadline: the longest a held delivery waits for the stall (the records reach
# the downstream within a few seconds of the worker's start), within the lease with the
# wait for room (22.8 / 4 + 12 + 1 = 18.7 s).
DELIVERY_TIMEOUT_S = 12
# The active beat's lock outlasts the stall, so the beat never stands by: its sweeper goes
# on the moment Redis answers again. (With the default 10 s the beat loses its lock during
# the stall, and sweeps again only a tick and a sweep interval after taking it back.)
BEAT_LOCK_TTL_S = 60
# Longer than the test: the beat's other maintenance jobs (the lost-message check, the
# monitor) never run, so none holds up the sweeper on their shared thread.
NEVER_S = 3600
# Off: each Redis call then fails after two socket timeouts (5 s each, the default), as the
# issue has it. (On, a pooled connection idle past it is replaced before use, and against a
# stopped Redis each replacement's handshake times out and replaces it again: a call waits
# until Redis answers, the beat's sweeper too.)
HEALTH_CHECK_INTERVAL_S = 0
# Far above the records in flight: the limits grant every ask, and each delivery holds a
# slot, given back (a Redis round trip) before its outcome is committed.
DELIVERY_CONCURRENCY = 1000


@pytest.mark.long
def test_redis_stalled_past_the_lease_posts_each_key_once(harness: Harness, tmp_path: Path) -> None:
    server = RedisServer(port=free_port(), workdir=tmp_path / "redis")
    server.start()
    pid = server.pid
    assert pid is not None
    # A held request waits at most a delivery's deadline (the worker has given up by then).
    downstream = Gauged(hold_s=DELIVERY_TIMEOUT_S)
    downstream.start()
    stopped = False
    try:
        harness.configure(
            redis_url=server.url,
            visibility_timeout_seconds=str(VISIBILITY_TIMEOUT_S),
            redis_health_check_interval_seconds=str(HEALTH_CHECK_INTERVAL_S),
            beat_lock_ttl_seconds=str(BEAT_LOCK_TTL_S),
            lost_check_interval_seconds=str(NEVER_S),
            monitor_interval_seconds=str(NEVER_S),
            **{
                f"lines__{LINE}__downstream_url": f"{downstream.url}/in",
                f"lines__{LINE}__delivery_timeout_s": str(DELIVERY_TIMEOUT_S),
                f"lines__{LINE}__delivery_concurrency": str(DELIVERY_CONCURRENCY),
                f"lines__{LINE}__deliveries_in_flight": str(RECORDS),
            },
        )
        client = harness.start_intake()
        ids = post_records(client, LINE, RECORDS, "STALL")
        # Every first delivery waits at the downstream until Redis has stopped: their
        # outcomes all land while it does not answer.
        downstream.held |= ids
        harness.start_beat()
        # The line's defaults: a thread pool, a thread per delivery in flight.
        harness.start_worker(LINE, pool=None, concurrency=None)
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
        rows = harness.rows("SELECT outcome, count(*) FROM record_attempts GROUP BY outcome")
        by_outcome = {row[0]: row[1] for row in rows}
        assert twice == {}, f"POSTed more than once; attempts by outcome: {by_outcome}"
        assert set(posted) == ids
        assert {r.status.value for r in final.values()} == {"done"}
        # One attempt each, its outcome committed while its lease was held.
        assert by_outcome == {"done": RECORDS}
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)
        downstream.release()
        downstream.stop()
        server.stop()
