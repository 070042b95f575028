"""Two beats at once: one fires, the other stands by; `kill -9` of the active one and the
standby takes over within the lock's TTL plus a tick, raising BEAT_TAKEOVER, with no fire
lost (fire_all) or doubled. A maintenance run longer than the TTL lets no standby take
over and delays no fire."""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from datetime import UTC, datetime, timedelta

from app.clock import utcnow
from app.schedules.cron import Misfire
from app.schedules.store import add
from beat.lock import LOCK_KEY
from tests.support.processes import wait_for
from tests.support.recorder import Recorder
from tests.support.slow_beat import SLOW_RETENTION_S, SLOW_RETENTION_SCHEDULER, SLOW_RUN

TTL_S = 3


def fire_times(harness) -> list[datetime]:
    keys = [r.dedup_key for r in harness.records() if r.dedup_key.startswith("schedule:tick:")]
    return sorted(datetime.fromisoformat(key.split(":", 2)[2]) for key in keys)


def test_standby_beat_takes_over_within_the_ttl_and_no_fire_is_lost_or_doubled(harness):
    alerts = Recorder().start()
    try:
        harness.configure(
            beat_lock_ttl_seconds=str(TTL_S),
            alert_webhooks=json.dumps([{"kind": "generic", "url": f"{alerts.url}/alerts"}]),
        )
        rt = harness.runtime()
        harness.run(
            "schedules",
            "add",
            "tick",
            "--cron",
            "* * * * * *",
            "--line",
            "order",
            "--misfire",
            "fire_all",
        ).process.wait(timeout=60)
        beats = {b.pid: b for b in (harness.start_beat(), harness.start_beat())}
        wait_for(lambda: rt.redis.get(LOCK_KEY), timeout_s=10, what="a beat to take the lock")
        # The holder fires every second while the other stands by.
        wait_for(
            lambda: len(fire_times(harness)) >= 3,
            timeout_s=30,
            what="three fires before the holder is killed",
        )
        holder_pid = int(rt.redis.get(LOCK_KEY).decode().split(":")[1])
        assert holder_pid in beats
        before = fire_times(harness)
        assert len(before) >= 3

        os.killpg(holder_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        beats[holder_pid].process.wait(timeout=10)

        def taken_over() -> bool:
            value = rt.redis.get(LOCK_KEY)
            return value is not None and int(value.decode().split(":")[1]) != holder_pid

        wait_for(taken_over, timeout_s=TTL_S + 5, what="the standby to take the lock")
        took_s = time.monotonic() - killed_at
        taken_at = datetime.now(UTC)
        count_at_takeover = len(fire_times(harness))
        wait_for(
            lambda: len(fire_times(harness)) > count_at_takeover,
            timeout_s=3,
            what="the new holder's first fire",
        )
        assert took_s <= TTL_S + 1.5, took_s
        # The new holder goes on firing, so the gaps checked below run past the takeover.
        wait_for(
            lambda: fire_times(harness)[-1] >= taken_at + timedelta(seconds=3),
            timeout_s=30,
            what="the new holder's fires of the three seconds after the takeover",
        )
        for pid, beat in beats.items():
            if pid != holder_pid:
                beat.stop()

        times = fire_times(harness)
        assert len(times) == len(set(times))
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert set(gaps) == {timedelta(seconds=1)}, "a fire was lost during the takeover"
        wait_for(
            lambda: any(r.body["event"] == "BEAT_TAKEOVER" for r in alerts.snapshot()),
            timeout_s=10,
            what="BEAT_TAKEOVER",
        )
        print(
            f"\nbeat takeover after {took_s:.1f} s (TTL {TTL_S} s); {len(times)} fires, "
            "none lost or doubled"
        )
    finally:
        alerts.stop()


def test_a_retention_run_longer_than_the_lock_ttl_delays_no_fire_and_lets_no_standby_take_over(
    harness,
):
    alerts = Recorder().start()
    try:
        harness.configure(
            beat_lock_ttl_seconds=str(TTL_S),
            retention_interval_seconds="1",
            alert_webhooks=json.dumps([{"kind": "generic", "url": f"{alerts.url}/alerts"}]),
        )
        rt = harness.runtime()
        with rt.engine.begin() as conn:
            add(
                conn,
                name="tick",
                cron="* * * * * *",
                timezone="UTC",
                line="order",
                payload={},
                misfire=Misfire.SKIP,
                catchup_window_s=3600,
                now=utcnow(),
            )
        # Each retention run lasts SLOW_RETENTION_S: longer than the lock's TTL, and than
        # the 3 s after which a fire counts as missed.
        beats = [
            harness.start_beat(wait=False, scheduler=SLOW_RETENTION_SCHEDULER),
            harness.start_beat(wait=False, scheduler=SLOW_RETENTION_SCHEDULER),
        ]
        for beat in beats:
            beat.wait_for_output("beat: Starting", timeout_s=40)
        wait_for(lambda: rt.redis.get(LOCK_KEY), timeout_s=10, what="a beat to take the lock")
        holder = rt.redis.get(LOCK_KEY)
        holder_pid = int(holder.decode().split(":")[1])
        (active,) = [b for b in beats if b.pid == holder_pid]
        (standby,) = [b for b in beats if b.pid != holder_pid]
        wait_for(lambda: fire_times(harness), timeout_s=5, what="the holder's first fire")
        # Retention runs one after another from a second after the holder took the lock:
        # the watch spans at least one whole run (two starts), with the standby up.
        watch_from = datetime.now(UTC)
        runs_before = active.output().count(SLOW_RUN)
        holders = set()
        deadline = time.monotonic() + 2 * SLOW_RETENTION_S + 1
        while time.monotonic() < deadline:
            holders.add(rt.redis.get(LOCK_KEY))
            time.sleep(0.1)
        watch_until = datetime.now(UTC)
        standby.stop()

        assert active.output().count(SLOW_RUN) - runs_before >= 2, "no whole slow run"
        assert holders == {holder}, "the standby took the lock over"
        assert "beat_lock_acquired" not in standby.output()
        assert not any(r.body["event"] == "BEAT_TAKEOVER" for r in alerts.snapshot())
        # Every second of the watch fired (the last one given a second to be made).
        first, last = watch_from - timedelta(seconds=1), watch_until - timedelta(seconds=2)
        times = [t for t in fire_times(harness) if first <= t <= last]
        expected_count = int((last - first).total_seconds())
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert set(gaps) == {timedelta(seconds=1)}, [f"{t:%H:%M:%S}" for t in times]
        assert len(times) >= expected_count, times
    finally:
        alerts.stop()
