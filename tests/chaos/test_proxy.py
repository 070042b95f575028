"""A scheduler incident: a proxy between every component and Redis that drops (or
closes) idle connections. A 6-field schedule fires every 2 s for 40 s; every fire must
have exactly one record, and every record must end done."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

import pytest

from app.local.embedded_redis import RedisServer
from app.observe.liveness import live_workers
from tests.support.processes import free_port
from tests.support.proxy import IdleProxy

RUN_S = 40


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["drop", "close"])
def test_schedule_through_a_proxy_that_mistreats_idle_connections(harness, tmp_path, mode):
    if not harness.env["PIPELINE_DATABASE_URL"].startswith("sqlite"):
        pytest.skip(
            "runs once, in the SQLite pass: the proxy is between Redis and the "
            "components, and the journal plays no part in it"
        )
    server = RedisServer(port=free_port(), workdir=tmp_path / "redis")
    server.start()
    proxy = IdleProxy(upstream_port=server.port, idle_s=3, mode=mode).start()
    try:
        harness.configure(redis_url=proxy.url, beat_lock_ttl_seconds="10")
        if os.environ.get("PIPELINE_TEST_PLAIN_REDIS"):
            # By hand only: a plain configuration, without the connection rules, to show
            # that this test catches what they prevent.
            harness.configure(
                redis_socket_timeout_seconds="0",
                redis_health_check_interval_seconds="0",
                redis_socket_keepalive="false",
                redis_retry_on_timeout="false",
            )
        harness.start_worker("order", pool="prefork", concurrency=1)
        beat = harness.start_beat()
        started = datetime.now(UTC)
        harness.run(
            "schedules",
            "add",
            "every2s",
            "--cron",
            "* * * * * */2",
            "--line",
            "order",
            "--misfire",
            "fire_all",
        ).process.wait(timeout=60)
        # A live worker must stay in the registry all along: its heartbeat connection idles
        # between beats, so the proxy mistreats it every time.
        registry = server.client()
        live_samples = []
        deadline = time.monotonic() + RUN_S
        while time.monotonic() < deadline:
            time.sleep(1)  # one sample a second for the whole run: the scenario, not a wait
            live_samples.append(len(live_workers(registry, "order")))
        registry.close()
        beat.stop()
        stopped = datetime.now(UTC)

        fired = [r for r in harness.records() if r.dedup_key.startswith("schedule:every2s:")]
        times = sorted(datetime.fromisoformat(r.dedup_key.split(":", 2)[2]) for r in fired)
        assert len(times) == len(set(times)), "a fire was recorded twice"
        # Every due time from the first fire to the last second beat ran has its record.
        expected = []
        t = times[0]
        while t <= stopped - timedelta(seconds=3):
            expected.append(t)
            t += timedelta(seconds=2)
        assert times[: len(expected)] == expected, "a fire is missing"
        assert len(times) >= RUN_S // 2 - 3
        assert times[0] - started < timedelta(seconds=10)
        final = harness.wait_until_final({r.id for r in fired}, timeout_s=60)
        assert {r.status.value for r in final.values()} == {"done"}
        assert proxy.dropped > 0, "the proxy never had an idle connection to mistreat"
        assert min(live_samples[5:]) == 1, f"the live worker left the registry: {live_samples}"
        print(
            f"\nproxy {mode}: {len(times)} fires, all done; {proxy.dropped} idle connections "
            f"{'dropped' if mode == 'drop' else 'closed'}"
        )
    finally:
        harness.close()
        proxy.stop()
        server.stop()
