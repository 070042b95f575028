"""Cron arithmetic and misfire decisions: pure, handed `now`, no I/O.

Expressions have five fields, or six where the sixth is seconds, as croniter reads them
(`* * * * * */2` fires every 2 s). Fires are computed in the schedule's time zone, so a
daily 02:30 fires once a day across daylight-saving changes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

# A fire this late is still "on time" for a beat already active when it was due (beat
# ticks every second); older ones were missed.
ON_TIME_S = 3.0
# `fire_all` catches up at most this many missed fires per schedule at once.
FIRE_ALL_CAP = 100


class Misfire(StrEnum):
    """What beat does with fires it missed (it was down, or a takeover was under way)."""

    FIRE_ONCE = "fire_once"
    SKIP = "skip"
    FIRE_ALL = "fire_all"


def check_cron(expression: str) -> str:
    """The expression, normalised. Raises `ValueError` with a readable reason."""
    fields = expression.split()
    if len(fields) not in (5, 6):
        raise ValueError(f"{expression!r}: a cron expression has 5 fields, or 6 with seconds")
    normalised = " ".join(fields)
    if not croniter.is_valid(normalised):
        raise ValueError(f"{expression!r} is not a valid cron expression")
    return normalised


def check_timezone(name: str) -> ZoneInfo:
    """The IANA time zone `name`. Raises `ValueError`."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{name!r} is not an IANA time zone") from None


def fires_between(
    expression: str, zone: str, *, after: datetime, until: datetime, cap: int
) -> list[datetime]:
    """Fire times in (`after`, `until`], oldest first, at most `cap` (the newest kept), UTC.

    Wall-clock time only moves forward: when clocks go back, the repeated hour does not
    fire again (a daily 02:30 fires once on that day, as cron does)."""
    tz = check_timezone(zone)
    iterator = croniter(expression, after.astimezone(tz))
    latest_wall = after.astimezone(tz).replace(tzinfo=None)
    fires: list[datetime] = []
    while True:
        fire = iterator.get_next(datetime)
        if fire > until:
            break
        wall = fire.astimezone(tz).replace(tzinfo=None)
        if wall <= latest_wall:
            continue
        latest_wall = wall
        fires.append(fire.astimezone(UTC))
        if len(fires) > cap:
            fires.pop(0)
    return fires


def next_fire(expression: str, zone: str, *, after: datetime) -> datetime:
    """The first fire time after `after`, in UTC."""
    fire: datetime = croniter(expression, after.astimezone(check_timezone(zone))).get_next(datetime)
    return fire.astimezone(UTC)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What to fire now, and how far the schedule has got (`fired_through`)."""

    fire: list[datetime]
    fired_through: datetime | None


def plan(
    expression: str,
    zone: str,
    *,
    policy: Misfire,
    catchup_window_s: int,
    after: datetime,
    active_since: datetime,
    now: datetime,
) -> Plan:
    """The fires due at `now` since `after` (the last fire made, else the schedule's
    creation), by the misfire policy, for a beat that has held the lock since
    `active_since`.

    On-time fires are always fired: due since `active_since`, and at most `ON_TIME_S`
    before `now`. Any other is missed, whatever its distance from `now`: one due before
    this beat became active was due while no beat fired. Missed ones: `fire_all` fires
    each within the catch-up window, oldest first, capped; `fire_once` the latest within
    the window; `skip` none."""
    due = fires_between(expression, zone, after=after, until=now, cap=FIRE_ALL_CAP)
    if not due:
        return Plan(fire=[], fired_through=None)
    on_time = [t for t in due if t >= active_since and (now - t).total_seconds() <= ON_TIME_S]
    missed = [t for t in due if t not in on_time]
    window_start = now - timedelta(seconds=catchup_window_s)
    catchable = [t for t in missed if t >= window_start]
    if policy is Misfire.FIRE_ALL:
        chosen = catchable
    elif policy is Misfire.FIRE_ONCE:
        chosen = catchable[-1:]
    else:
        chosen = []
    return Plan(fire=[*chosen, *on_time], fired_through=due[-1])
