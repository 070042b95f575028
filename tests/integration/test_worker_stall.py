"""A worker that lives but does not consume: its heartbeat says so, it raises
`WORKER_STALLED`, and it consumes its line's queue again."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from app.celery_app import create_celery
from app.observe.liveness import heartbeat_key, live_workers
from tests.support.harness import Harness
from tests.support.processes import wait_for
from tests.support.recorder import Recorder
from tests.support.stall import (
    BLOCK_BUSINESS_NO,
    DETACH_BUSINESS_NO,
    LONG_BUSINESS_NO,
    UNBLOCK_KEY,
)
from workers.heartbeat import STUCK_EXIT_CODE

pytestmark = pytest.mark.journal_independent

# Small, so that the test takes seconds: the worker checks its consumer at every heartbeat
# (a third of the TTL, 1 s) and calls it stalled after 2 s with work waiting and nothing taken.
HEARTBEAT_TTL_S = "3"
STALL_AFTER_S = "2"


@pytest.fixture
def hooks(harness: Harness) -> Iterator[Recorder]:
    recorder = Recorder().start()
    harness.configure(
        worker_heartbeat_ttl_seconds=HEARTBEAT_TTL_S,
        worker_stall_after_seconds=STALL_AFTER_S,
        alert_webhooks=json.dumps([{"kind": "generic", "url": f"{recorder.url}/generic"}]),
    )
    try:
        yield recorder
    finally:
        recorder.stop()


def _alerts(recorder: Recorder, event: str) -> list[dict[str, Any]]:
    return [r.body for r in recorder.snapshot() if r.body and r.body.get("event") == event]


def test_a_cancelled_consumer_raises_worker_stalled_and_its_records_end_done(
    harness: Harness, hooks: Recorder
) -> None:
    client = harness.start_intake()
    harness.start_worker("order")
    celery = create_celery(harness.settings())
    try:
        with celery.connection_for_write() as conn:
            # One worker answers: `limit` ends each wait at its answer, not at the timeout.
            replies = celery.control.cancel_consumer(
                "order", reply=True, timeout=10, limit=1, connection=conn
            )
            assert replies, "the worker did not answer cancel_consumer"

            # The worker cancels on its event loop after it answered: wait until it has.
            def consumes_nothing() -> bool:
                active = celery.control.inspect(timeout=5, limit=1, connection=conn).active_queues()
                return bool(active) and all(queues == [] for queues in active.values())

            wait_for(consumes_nothing, timeout_s=20, what="the worker to stop consuming")
    finally:
        celery.close()

    ids = set()
    for n in range(3):
        response = client.post("/v1/order", json={"business_no": f"STALL-{n}"})
        assert response.status_code == 202
        ids.add(response.json()["id"])

    wait_for(lambda: _alerts(hooks, "WORKER_STALLED"), timeout_s=60, what="WORKER_STALLED")
    alert = _alerts(hooks, "WORKER_STALLED")[0]
    assert alert["line"] == "order"
    assert alert["details"]["hostname"].startswith("order@")
    assert alert["details"]["queue_depth"] >= 1
    assert alert["details"]["consuming"] is False
    assert alert["details"]["restarts_pending"] == 0

    finished = harness.wait_until_final(ids, timeout_s=60)
    assert {record.status.value for record in finished.values()} == {"done"}
    # It took them, so its next heartbeat says it is live again.
    rt = harness.runtime()
    wait_for(
        lambda: live_workers(rt.redis, "order") == [alert["details"]["hostname"]],
        timeout_s=10,
        what="the worker to count as live again",
    )


def test_a_consumer_subscribed_but_fetching_nothing_reconnects_and_its_records_end_done(
    harness: Harness, hooks: Recorder
) -> None:
    harness.configure(lines__order__handler="tests.support.stall:detach_fetch")
    client = harness.start_intake()
    harness.start_worker("order")
    detach = client.post("/v1/order", json={"business_no": DETACH_BUSINESS_NO}).json()["id"]
    harness.wait_until_final({detach}, timeout_s=30)

    ids = set()
    for n in range(3):
        response = client.post("/v1/order", json={"business_no": f"STALL-{n}"})
        assert response.status_code == 202
        ids.add(response.json()["id"])

    wait_for(lambda: _alerts(hooks, "WORKER_STALLED"), timeout_s=60, what="WORKER_STALLED")
    alert = _alerts(hooks, "WORKER_STALLED")[0]
    assert alert["details"]["consuming"] is True
    assert alert["details"]["queue_depth"] >= 1

    finished = harness.wait_until_final(ids, timeout_s=60)
    assert {record.status.value for record in finished.values()} == {"done"}


@pytest.mark.parametrize(
    ("pool", "slots"),
    # A solo worker runs one task at a time, on its event loop, whatever its prefetch count.
    [("prefork", 2), ("solo", 1)],
)
def test_a_worker_whose_slots_are_all_held_by_long_tasks_is_busy_not_stalled(
    harness: Harness, hooks: Recorder, pool: str, slots: int
) -> None:
    harness.configure(lines__order__handler="tests.support.stall:hold")
    client = harness.start_intake()
    harness.start_worker("order", pool=pool, concurrency=2)
    rt = harness.runtime()
    ids = set()
    for n in range(slots + 1):  # one more than it may hold: it waits
        response = client.post("/v1/order", json={"business_no": f"LONG-{n}"})
        assert response.status_code == 202
        ids.add(response.json()["id"])

    def beat() -> dict[str, Any]:
        """The worker's heartbeat, stalled or not."""
        for key in rt.redis.scan_iter(match=heartbeat_key("order", "*")):
            raw = rt.redis.get(key)
            return dict(json.loads(raw)) if raw else {}
        return {}

    def busy_with_work_waiting() -> bool:
        consumer = beat().get("consumer", {})
        return consumer.get("held") == slots and consumer.get("slots") == slots

    # Every slot held by 4 s tasks while messages wait: past the 2 s threshold, and still
    # live and quiet.
    wait_for(busy_with_work_waiting, timeout_s=30, what="a heartbeat with every slot held")
    finished = harness.wait_until_final(ids, timeout_s=60)
    assert {record.status.value for record in finished.values()} == {"done"}
    assert not _alerts(hooks, "WORKER_STALLED")
    assert beat()["stalled"] is False


def test_a_worker_in_its_soft_shutdown_is_not_stalled_and_takes_nothing_more(
    harness: Harness, hooks: Recorder
) -> None:
    # A soft shutdown longer than the stall threshold and the check after it.
    harness.configure(
        lines__order__handler="tests.support.stall:hold_long", worker_soft_shutdown_seconds="5"
    )
    client = harness.start_intake()
    worker = harness.start_worker("order", pool="prefork", concurrency=2)
    long = client.post("/v1/order", json={"business_no": LONG_BUSINESS_NO}).json()["id"]

    def attempts(ids: set[str]) -> dict[str, int]:
        return {record.id: record.attempts for record in harness.records() if record.id in ids}

    wait_for(lambda: attempts({long}) == {long: 1}, timeout_s=20, what="the long task to start")
    # One slot free; the soft shutdown holds the worker's event loop while work arrives.
    worker.ask_to_stop(signal.SIGQUIT)
    worker.wait_for_output("Soft Shutdown", timeout_s=10)
    waiting = {
        client.post("/v1/order", json={"business_no": f"LATE-{n}"}).json()["id"] for n in range(3)
    }
    assert worker.process is not None
    worker.process.wait(timeout=15)

    assert not _alerts(hooks, "WORKER_STALLED")
    assert "WORKER_STALLED" not in worker.output()
    assert "consumer_restarted" not in worker.output()
    assert attempts(waiting) == dict.fromkeys(waiting, 0)


@pytest.mark.parametrize(
    ("comes_back", "soft_shutdown_s"),
    [(False, "1"), (True, "5")],
    ids=["stays-stuck", "comes-back-in-its-shutdown"],
)
def test_a_worker_whose_event_loop_is_stuck_exits_for_its_supervisor(
    harness: Harness, hooks: Recorder, comes_back: bool, soft_shutdown_s: str
) -> None:
    # It waits for its own shutdown this soft shutdown and the stall threshold again.
    harness.configure(
        lines__order__handler="tests.support.stall:block_loop",
        worker_soft_shutdown_seconds=soft_shutdown_s,
    )
    client = harness.start_intake()
    worker = harness.start_worker("order")
    for business_no in (BLOCK_BUSINESS_NO, "WAITING-0", "WAITING-1", "WAITING-2"):
        assert client.post("/v1/order", json={"business_no": business_no}).status_code == 202

    # Stalled after 2 s, its restart not run 2 s later: it signals itself.
    worker.wait_for_output("worker_stuck_exiting", timeout_s=20)
    if comes_back:
        harness.runtime().redis.set(UNBLOCK_KEY, 1)
    assert worker.process is not None
    worker.process.wait(timeout=15)
    # Whether Celery's shutdown ended it or, the loop stuck still, it ended itself.
    assert worker.process.returncode == STUCK_EXIT_CODE
    assert ("worker_stuck_exited" in worker.output()) is not comes_back

    # One incident: its message went out when the consumer stalled; that the worker exits
    # updates it (its reason), without a second message.
    def incident_says_it_exits() -> bool:
        alerts = client.get("/v1/alerts", params={"limit": 50}).json()["alerts"]
        return any(
            alert["event"] == "WORKER_STALLED" and "exits" in alert["reason"] for alert in alerts
        )

    wait_for(incident_says_it_exits, timeout_s=5, what="WORKER_STALLED saying the worker exits")
    assert len(_alerts(hooks, "WORKER_STALLED")) == 1
