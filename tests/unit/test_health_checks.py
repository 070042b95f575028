"""The health strip's decisions, over values: a beat holding the lock (and for how long),
a sweep that is late, a schedule whose fire is overdue; and the minute buckets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.observe.health import BeatState, beat_check, schedules_check, sweep_check
from app.schedules.cron import Misfire
from app.schedules.store import Schedule
from app.telemetry import throughput

NOW = datetime(2026, 12, 3, 10, 0, 30, tzinfo=UTC)


def state(**overrides) -> BeatState:
    values = {
        "holder": "host-a:42:abcd1234",
        "lock_left_s": 7.5,
        "active_identity": "host-a:42:abcd1234",
        "active_since": NOW - timedelta(hours=2),
        "last_sweep": NOW - timedelta(seconds=1),
    }
    return BeatState(**(values | overrides))


def schedule(name: str, *, enabled: bool = True, next_fire_at=None, last_fire_at=None) -> Schedule:
    return Schedule(
        name=name,
        cron="* * * * *",
        timezone="UTC",
        line="order",
        payload={},
        enabled=enabled,
        misfire=Misfire.FIRE_ONCE,
        catchup_window_s=0,
        last_fire_at=last_fire_at,
        next_fire_at=next_fire_at,
        created_at=NOW,
        updated_at=NOW,
    )


def test_a_held_lock_names_its_host_its_age_and_its_last_renewal():
    check = beat_check(state(), ttl_s=10, now=NOW)
    assert check.ok
    assert check.figures["host"] == "host-a"
    assert check.figures["lock_age_s"] == 7200
    assert check.figures["renewed_s_ago"] == 2.5


def test_no_lock_is_a_failure_with_its_consequence():
    check = beat_check(state(holder=None, lock_left_s=None), ttl_s=10, now=NOW)
    assert not check.ok
    assert "nothing fires the schedules" in check.reason


def test_a_note_of_another_beat_gives_no_lock_age():
    check = beat_check(state(active_identity="host-b:1:x"), ttl_s=10, now=NOW)
    assert check.ok
    assert check.figures["lock_age_s"] is None


def test_a_sweep_is_late_after_five_intervals_and_never_before_thirty_seconds():
    assert sweep_check(NOW - timedelta(seconds=29), interval_s=2, now=NOW).ok
    late = sweep_check(NOW - timedelta(seconds=31), interval_s=2, now=NOW)
    assert not late.ok
    assert late.reason == "the last sweep finished 31 s ago; it runs every 2 s"
    assert sweep_check(NOW - timedelta(seconds=45), interval_s=10, now=NOW).ok
    assert not sweep_check(None, interval_s=2, now=NOW).ok


def test_an_enabled_schedule_overdue_by_a_minute_is_late_and_a_disabled_one_never():
    due = NOW - timedelta(seconds=61)
    late = schedules_check([schedule("a", next_fire_at=due)], now=NOW)
    assert not late.ok
    assert late.figures["late"] == ["a"]
    assert schedules_check([schedule("a", next_fire_at=NOW - timedelta(seconds=59))], now=NOW).ok
    assert schedules_check([schedule("a", enabled=False, next_fire_at=due)], now=NOW).ok


def test_the_schedules_last_fire_is_the_newest_of_the_enabled_ones():
    fired = NOW - timedelta(seconds=10)
    check = schedules_check(
        [
            schedule("a", last_fire_at=fired, next_fire_at=NOW + timedelta(seconds=50)),
            schedule("b", last_fire_at=fired - timedelta(hours=1), next_fire_at=NOW),
        ],
        now=NOW,
    )
    assert check.ok
    assert check.figures["last_fire_at"] == fired.isoformat()
    assert check.reason == f"2 enabled, last fire {fired.isoformat()}"


def test_a_minute_bucket_starts_on_the_minute():
    assert throughput.minute_of(NOW) == int(datetime(2026, 12, 3, 10, 0, tzinfo=UTC).timestamp())
    assert throughput.bucket_key("order", 60) == "pipeline:throughput:order:60"
