"""The registry of live workers: a worker whose heartbeat says its consumer is stalled is
not live, for `/v1/lines` and for the monitor's `NO_CONSUMER`."""

from __future__ import annotations

import pytest

from app.clock import utcnow
from app.observe.liveness import ConsumerReport, heartbeat_key, publish_heartbeat, stalled_workers
from app.telemetry.events import Event
from tests.support.harness import Harness

pytestmark = pytest.mark.journal_independent


def test_a_worker_whose_heartbeat_says_stalled_is_not_live_for_the_lines_view_and_the_monitor(
    harness: Harness,
) -> None:
    client = harness.start_intake()
    rt = harness.runtime()
    assert client.post("/v1/order", json={"business_no": "WAITS"}).status_code == 202

    def beat(*, stalled: bool) -> None:
        report = ConsumerReport(
            stalled=stalled, taken=0, consuming=True, held=0, slots=1, starved_s=0.0
        )
        publish_heartbeat(
            rt.redis,
            line="order",
            hostname="order@a",
            pid=1,
            ttl_s=60,
            now=utcnow(),
            consumer=report,
        )

    def live() -> int:
        rows = client.get("/v1/lines").json()["lines"]
        return int(next(row["live_workers"] for row in rows if row["line"] == "order"))

    beat(stalled=False)
    assert live() == 1
    assert Event.NO_CONSUMER not in rt.monitor.monitor(now=utcnow())

    beat(stalled=True)
    assert live() == 0
    assert stalled_workers(rt.redis, "order") == ["order@a"]
    assert Event.NO_CONSUMER in rt.monitor.monitor(now=utcnow())

    # A worker of the version before stalls were told publishes no `stalled`: live.
    rt.redis.set(heartbeat_key("order", "order@b"), '{"hostname": "order@b", "pid": 2}', px=60_000)
    assert live() == 1
