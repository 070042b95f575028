"""kombu puts the messages a worker held back on the queue without asking (a killed
worker's, after the visibility timeout; a stopped worker's, at its soft shutdown). They
never pass the line's bound: the bound counts a message's records until a worker acks it,
so a held message keeps its room on the queue, and its requeue takes no more. Measured
here, with a worker killed while it holds all it can."""

from __future__ import annotations

import os
import signal
import time

from tests.integration.test_overload import DepthSampler
from tests.support.processes import wait_for
from tests.support.runs import overlapping, runs_by_record, use_runs_log

BOUND = 4
CONCURRENCY = 3  # prefetch 1: a prefork worker holds one message per process


def test_a_killed_workers_messages_come_back_without_passing_the_bound(harness, tmp_path):
    log = use_runs_log(harness, tmp_path)
    harness.configure(
        lines__order__max_queue_length=str(BOUND),
        lines__order__sender_queue_share="1",
        lines__order__batch_size="1",
        visibility_timeout_seconds="10",
    )
    client = harness.start_intake()
    harness.start_beat()  # its sweeper refills the queue from the deferred records
    rt = harness.runtime()
    ids = {
        client.post("/v1/order", json={"business_no": f"B-{n}", "sleep_s": 5}).json()["id"]
        for n in range(3)
    }
    ids |= {
        client.post("/v1/order", json={"business_no": f"Q-{n}", "sleep_s": 1}).json()["id"]
        for n in range(36)
    }
    with DepthSampler(rt.redis, "order") as sampler:
        doomed = harness.start_worker("order", pool="prefork", concurrency=CONCURRENCY)
        # It holds the three slow ones; the sweeper fills the queue up to the bound, which
        # counts the held ones.
        wait_for(lambda: len(runs_by_record(log)) == CONCURRENCY, timeout_s=30, what="held")
        wait_for(lambda: rt.pusher.depth("order") == BOUND, timeout_s=30, what="a full queue")
        assert rt.redis.llen("order") == BOUND - CONCURRENCY
        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.process.wait(timeout=10)
        killed_at = time.time()
        # Its successor keeps busy, and the sweeper keeps the queue full, until kombu puts
        # the killed worker's messages back, past the visibility timeout.
        harness.start_worker("order", pool="prefork", concurrency=CONCURRENCY)
        final = harness.wait_until_final(ids, timeout_s=120)
    deepest = max(sampler.samples)
    # Waiting messages of one record each: never more than the bound, requeues included.
    assert deepest <= BOUND
    assert {r.status.value for r in final.values()} == {"done"}
    assert overlapping(runs_by_record(log), killed_at=killed_at) == {}
