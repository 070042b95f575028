"""Fires missed while no beat was active follow each schedule's misfire policy, the one
due just before the restart too: beat is killed, and the next beat becomes active 20 s
later, 1.2 s after a fire time."""

from __future__ import annotations

import os
import signal
from datetime import datetime, timedelta

from app.clock import utcnow
from app.schedules.cron import Misfire
from app.schedules.store import add
from beat.lock import LOCK_KEY
from tests.support.processes import wait_for

PERIOD = timedelta(seconds=5)
OUTAGE = timedelta(seconds=20)
# The next beat becomes active this long after a fire time: well within the 3 s in which
# a fire still counts as on time when a beat that was already active ticks late.
AFTER_FIRE = timedelta(seconds=1.2)
POLICIES = {"once": Misfire.FIRE_ONCE, "skip": Misfire.SKIP, "all": Misfire.FIRE_ALL}


def fires(harness, name: str) -> list[datetime]:
    prefix = f"schedule:{name}:"
    keys = [r.dedup_key for r in harness.records() if r.dedup_key.startswith(prefix)]
    return sorted(datetime.fromisoformat(key.removeprefix(prefix)) for key in keys)


def test_fires_missed_in_an_outage_follow_the_misfire_policy_up_to_the_restart(harness):
    harness.configure(beat_lock_ttl_seconds="3")
    rt = harness.runtime()
    with rt.engine.begin() as conn:
        for name, policy in POLICIES.items():
            add(
                conn,
                name=name,
                cron="* * * * * */5",
                timezone="UTC",
                line="order",
                payload={},
                misfire=policy,
                catchup_window_s=3600,
                now=utcnow(),
            )
    first = harness.start_beat()
    wait_for(
        lambda: all(fires(harness, name) for name in POLICIES),
        timeout_s=20,
        what="a fire of each schedule",
    )
    os.killpg(first.pid, signal.SIGKILL)
    first.process.wait(timeout=10)
    last = max(fires(harness, name)[-1] for name in POLICIES)
    restart = last + OUTAGE + AFTER_FIRE
    # The killed beat's lock outlives it until the restart: the next beat, started now,
    # stands by until then, and becomes active within a second of it. Set afresh, not
    # extended: the killed beat's own key (3 s TTL) may be gone by now on a loaded machine.
    dead_identity = f"killed-beat:{first.pid}"
    assert rt.redis.set(LOCK_KEY, dead_identity, pxat=int(restart.timestamp() * 1000))
    harness.start_beat()
    on_time = last + OUTAGE + PERIOD  # the first fire due after the restart
    wait_for(
        lambda: all(fires(harness, name)[-1] >= on_time for name in POLICIES),
        timeout_s=(on_time - utcnow()).total_seconds() + 10,
        what="the first fire after the restart",
    )

    def clock(times: list[datetime]) -> list[str]:
        return [f"{t:%H:%M:%S}" for t in times]

    missed = [last + PERIOD * n for n in range(1, 5)]
    made = {
        name: clock([t for t in fires(harness, name) if last < t <= on_time]) for name in POLICIES
    }
    assert made == {
        "once": clock([missed[-1], on_time]),
        "skip": clock([on_time]),
        "all": clock([*missed, on_time]),
    }
