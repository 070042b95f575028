from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.schedules.cron import Misfire, check_cron, check_timezone, fires_between, plan

BERLIN = ZoneInfo("Europe/Berlin")


def local_days(fires: list[datetime]) -> list[str]:
    return [f.astimezone(BERLIN).strftime("%m-%d %H:%M") for f in fires]


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        # Spring forward (29 March): 02:30 does not exist that night; it fires once, at 03:00.
        (
            datetime(2026, 3, 27, tzinfo=UTC),
            datetime(2026, 3, 31, tzinfo=UTC),
            ["03-27 02:30", "03-28 02:30", "03-29 03:00", "03-30 02:30"],
        ),
        # Fall back (25 October): 02:30 happens twice on the wall clock; it fires once.
        (
            datetime(2026, 10, 23, tzinfo=UTC),
            datetime(2026, 10, 27, tzinfo=UTC),
            ["10-23 02:30", "10-24 02:30", "10-25 02:30", "10-26 02:30"],
        ),
    ],
)
def test_a_daily_0230_fires_once_per_day_across_a_dst_change(start, end, expected):
    assert (
        local_days(fires_between("30 2 * * *", "Europe/Berlin", after=start, until=end, cap=100))
        == expected
    )


def test_a_daily_0230_ticked_every_minute_across_fall_back_fires_once_that_day():
    """As beat runs it: a plan at every minute of the night, each from the last fire."""
    created = datetime(2026, 10, 24, 12, tzinfo=UTC)
    last, fired = None, []
    now = created
    while now < datetime(2026, 10, 26, 12, tzinfo=UTC):
        now += timedelta(minutes=1)
        step = plan(
            "30 2 * * *",
            "Europe/Berlin",
            policy=Misfire.FIRE_ALL,
            catchup_window_s=3600,
            after=last or created,
            active_since=created,
            now=now,
        )
        fired += step.fire
        last = step.fired_through or last
    assert local_days(fired) == ["10-25 02:30", "10-26 02:30"]


def test_six_fields_means_seconds():
    start = datetime(2026, 1, 1, tzinfo=UTC)
    fires = fires_between(
        "* * * * * */2", "UTC", after=start, until=start + timedelta(seconds=10), cap=100
    )
    assert [int((f - start).total_seconds()) for f in fires] == [2, 4, 6, 8, 10]


@pytest.mark.parametrize(
    "expression", ["* * * *", "61 * * * *", "* * * * * * *", "every minute", ""]
)
def test_an_invalid_cron_expression_is_refused(expression):
    with pytest.raises(ValueError, match="cron"):
        check_cron(expression)


def test_an_unknown_time_zone_is_refused():
    with pytest.raises(ValueError, match="IANA"):
        check_timezone("Mars/Olympus")


MINUTE = "* * * * *"
LAST = datetime(2026, 5, 1, 10, 0, tzinfo=UTC)
# Beat was down from 10:00:30 to 10:03:30: 10:01, 10:02 and 10:03 were missed.
RESTART = datetime(2026, 5, 1, 10, 3, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("policy", "fired"),
    [(Misfire.FIRE_ALL, [1, 2, 3]), (Misfire.FIRE_ONCE, [3]), (Misfire.SKIP, [])],
)
def test_missed_fires_follow_the_misfire_policy(policy, fired):
    step = plan(
        MINUTE,
        "UTC",
        policy=policy,
        catchup_window_s=3600,
        after=LAST,
        active_since=RESTART,
        now=RESTART,
    )
    assert [f.minute for f in step.fire] == fired
    assert step.fired_through == datetime(2026, 5, 1, 10, 3, tzinfo=UTC)
    again = plan(
        MINUTE,
        "UTC",
        policy=policy,
        catchup_window_s=3600,
        after=step.fired_through,
        active_since=RESTART,
        now=RESTART,
    )
    assert again.fire == []


def test_missed_fires_older_than_the_catchup_window_are_not_fired():
    step = plan(
        MINUTE,
        "UTC",
        policy=Misfire.FIRE_ALL,
        catchup_window_s=90,
        after=LAST,
        active_since=RESTART,
        now=RESTART,
    )
    assert [f.minute for f in step.fire] == [2, 3]


@pytest.mark.parametrize(
    "active_since", [LAST, datetime(2026, 5, 1, 10, 0, 59, 900_000, tzinfo=UTC)]
)
def test_an_on_time_fire_is_fired_under_every_policy(active_since):
    """Due after the beat became active, and at most ON_TIME_S before the tick."""
    now = datetime(2026, 5, 1, 10, 1, 3, tzinfo=UTC)
    for policy in Misfire:
        step = plan(
            MINUTE,
            "UTC",
            policy=policy,
            catchup_window_s=0,
            after=LAST,
            active_since=active_since,
            now=now,
        )
        assert [f.minute for f in step.fire] == [1], policy


# Beat was down from 10:00:30; a beat became active at 10:03:01.2, 1.2 s after the 10:03
# fire, and ticked at 10:03:01.5: that fire is within ON_TIME_S of the tick, yet it was
# due while no beat was active, so it is a misfire like 10:01 and 10:02.
ACTIVE_SINCE = datetime(2026, 5, 1, 10, 3, 1, 200_000, tzinfo=UTC)
FIRST_TICK = ACTIVE_SINCE + timedelta(seconds=0.3)


@pytest.mark.parametrize(
    ("policy", "fired"),
    [(Misfire.FIRE_ALL, [1, 2, 3]), (Misfire.FIRE_ONCE, [3]), (Misfire.SKIP, [])],
)
def test_a_fire_due_just_before_the_beat_became_active_is_a_misfire(policy, fired):
    step = plan(
        MINUTE,
        "UTC",
        policy=policy,
        catchup_window_s=3600,
        after=LAST,
        active_since=ACTIVE_SINCE,
        now=FIRST_TICK,
    )
    assert [f.minute for f in step.fire] == fired
    assert step.fired_through == datetime(2026, 5, 1, 10, 3, tzinfo=UTC)
