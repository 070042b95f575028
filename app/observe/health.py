"""The health of the pipeline's parts, as the console's strip shows it: Redis, the journal,
the active beat (its host and how long it has held the lock), the last sweep's age, and
the schedules' fires. Each is a `Check`: ok or not, and a sentence saying why.

The active beat says what it is doing in two Redis keys beside its lock: who is active
and since when (`note_active_beat`, every tick, expiring with the lock), and when its last
sweep finished (`note_sweep`). Writing them never fails the beat. The decisions are pure
functions over what was read (`beat_check`, `sweep_check`, `schedules_check`).

Above the checks, the page's state (`page_state`): `down`, `degraded` or `ok`, with the
reasons (`Reason`) that say why, judged from the lines' status as the monitor judges its
alerts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis

from app.config.redis import as_text
from app.observe.line_view import LineStatus
from app.observe.monitor import check_line, more_findings
from app.schedules.store import Schedule
from app.telemetry.events import Event
from app.telemetry.logs import get_logger

log = get_logger(__name__)

# The beat's lock (`beat.lock`): its value names the holder, `host:pid:token`.
LOCK_KEY = "pipeline:beat:lock"
ACTIVE_KEY = "pipeline:beat:active"
SWEEP_KEY = "pipeline:beat:last_sweep"
# The last sweep is late after this many sweep intervals, and never sooner than
# `SWEEP_LATE_MIN_S`: a sweep of a big backlog takes a few intervals by itself.
SWEEP_LATE_INTERVALS = 5
SWEEP_LATE_MIN_S = 30.0
# A schedule whose next fire is this far in the past was not fired: beat fires on the
# second, and a takeover takes at most a lock's TTL.
SCHEDULE_LATE_S = 60.0


@dataclass(frozen=True, kw_only=True)
class Check:
    """One part's health: `ok`, a sentence saying why (the reason when it fails), and the
    figures behind it."""

    name: str
    ok: bool
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "reason": self.reason, **self.figures}


def note_active_beat(client: redis.Redis, *, identity: str, since: datetime, ttl_s: float) -> None:
    """Say that the beat `identity` has held the lock since `since` (for `ttl_s`). Never
    raises: a Redis that does not answer only leaves the strip without it."""
    value = json.dumps({"identity": identity, "since": since.isoformat()})
    try:
        client.set(ACTIVE_KEY, value, px=int(ttl_s * 1000))
    except redis.RedisError as exc:
        log.debug("beat_note_failed", error=type(exc).__name__)


def note_sweep(client: redis.Redis, *, at: datetime) -> None:
    """Say that a sweep finished at `at`. Never raises."""
    try:
        client.set(SWEEP_KEY, at.isoformat())
    except redis.RedisError as exc:
        log.debug("sweep_note_failed", error=type(exc).__name__)


@dataclass(frozen=True, kw_only=True)
class BeatState:
    """What Redis says of the beats: the lock's holder and the seconds its lock has left,
    the active beat's note, and the last sweep."""

    holder: str | None
    lock_left_s: float | None
    active_identity: str | None
    active_since: datetime | None
    last_sweep: datetime | None


def read_beat(client: redis.Redis) -> BeatState:
    """Read the lock, the active beat's note and the last sweep. Raises `redis.RedisError`."""
    with client.pipeline(transaction=False) as pipe:
        pipe.get(LOCK_KEY)
        pipe.pttl(LOCK_KEY)
        pipe.get(ACTIVE_KEY)
        pipe.get(SWEEP_KEY)
        holder, pttl, active, sweep = pipe.execute()
    identity, since = None, None
    if active is not None:
        try:
            note = json.loads(active)
            identity, since = str(note["identity"]), datetime.fromisoformat(note["since"])
        except (ValueError, KeyError, TypeError):
            identity, since = None, None
    last_sweep = None
    if sweep is not None:
        try:
            last_sweep = datetime.fromisoformat(as_text(sweep))
        except ValueError:
            last_sweep = None
    return BeatState(
        holder=None if holder is None else as_text(holder),
        lock_left_s=pttl / 1000 if pttl is not None and pttl >= 0 else None,
        active_identity=identity,
        active_since=since,
        last_sweep=last_sweep,
    )


def beat_check(state: BeatState, *, ttl_s: float, now: datetime) -> Check:
    """Whether a beat holds the lock: its host, how long it has held it (`lock_age_s`) and
    how long ago it last renewed it."""
    if state.holder is None:
        return Check(
            name="beat",
            ok=False,
            reason="no beat holds the lock: nothing fires the schedules or runs the sweeper",
            figures={"host": None, "lock_age_s": None, "renewed_s_ago": None},
        )
    host = state.holder.split(":", 1)[0]
    renewed = None if state.lock_left_s is None else max(0.0, ttl_s - state.lock_left_s)
    age = None
    if state.active_identity == state.holder and state.active_since is not None:
        age = max(0.0, (now - state.active_since).total_seconds())
    return Check(
        name="beat",
        ok=True,
        reason=f"beat on {host} holds the lock",
        figures={
            "host": host,
            "holder": state.holder,
            "lock_age_s": age,
            "renewed_s_ago": renewed,
        },
    )


def sweep_check(last_sweep: datetime | None, *, interval_s: float, now: datetime) -> Check:
    """Whether the sweeper ran lately: it is late after `SWEEP_LATE_INTERVALS` intervals."""
    late_after_s = max(SWEEP_LATE_MIN_S, SWEEP_LATE_INTERVALS * interval_s)
    if last_sweep is None:
        return Check(
            name="sweep",
            ok=False,
            reason="no sweep has run: records whose retry is due or whose push failed wait",
            figures={"last_sweep_at": None, "age_s": None},
        )
    age = max(0.0, (now - last_sweep).total_seconds())
    figures = {"last_sweep_at": last_sweep.isoformat(), "age_s": age}
    if age > late_after_s:
        return Check(
            name="sweep",
            ok=False,
            reason=f"the last sweep finished {age:.0f} s ago; it runs every {interval_s:g} s",
            figures=figures,
        )
    return Check(name="sweep", ok=True, reason=f"last sweep {age:.0f} s ago", figures=figures)


def schedules_check(schedules: Sequence[Schedule], *, now: datetime) -> Check:
    """Whether every enabled schedule fired when due: one whose next fire is more than
    `SCHEDULE_LATE_S` in the past is late."""
    enabled = [s for s in schedules if s.enabled]
    fired = [s.last_fire_at for s in enabled if s.last_fire_at is not None]
    last = max(fired) if fired else None
    figures: dict[str, Any] = {
        "enabled": len(enabled),
        "last_fire_at": last.isoformat() if last else None,
        "late": [],
    }
    late = [
        s
        for s in enabled
        if s.next_fire_at is not None and (now - s.next_fire_at).total_seconds() > SCHEDULE_LATE_S
    ]
    if late:
        figures["late"] = [s.name for s in late]
        first = min(late, key=lambda s: s.next_fire_at or now)
        overdue = (now - (first.next_fire_at or now)).total_seconds()
        return Check(
            name="schedules",
            ok=False,
            reason=f"{len(late)} schedule(s) late: {first.name!r} was due {overdue:.0f} s ago",
            figures=figures,
        )
    if not enabled:
        return Check(name="schedules", ok=True, reason="no schedule enabled", figures=figures)
    when = f"last fire {last.isoformat()}" if last else "none has fired yet"
    return Check(
        name="schedules", ok=True, reason=f"{len(enabled)} enabled, {when}", figures=figures
    )


# The page's state: `down` when the pipeline cannot take or deliver (Redis or the journal
# does not answer), `degraded` when a line is in trouble, `ok` otherwise.
OK, DEGRADED, DOWN = "ok", "degraded", "down"
DOWN_CODES = frozenset({"redis_down", "journal_down"})
# What each condition alert of a line is called among the page's reasons.
REASON_CODES = {
    Event.NO_CONSUMER: "no_live_workers",
    Event.BACKLOG: "backlog",
    Event.DOWNSTREAM_DOWN: "circuit_open",
    Event.WORKER_STALLED: "stalled_worker",
    Event.HANDLER_STUCK: "handler_stuck",
    Event.QUEUE_FULL: "queue_full",
}


@dataclass(frozen=True, kw_only=True)
class Reason:
    """Why the page is not ok: a code, the line it concerns (None: the pipeline), and a
    sentence."""

    code: str
    line: str | None
    message: str

    def public(self) -> dict[str, Any]:
        return {"code": self.code, "line": self.line, "message": self.message}


def line_reasons(rows: Sequence[LineStatus], *, backlog_after_s: float) -> list[Reason]:
    """The lines' troubles, judged as the monitor judges its alerts (`check_line`,
    `more_findings`), and a paused line."""
    reasons = []
    for row in rows:
        if row.pause is not None:
            by = f" by {row.pause.actor}" if row.pause.actor else ""
            reasons.append(
                Reason(code="paused", line=row.line, message=f"{row.line!r} is paused{by}")
            )
        findings = [*check_line(row, backlog_after_s=backlog_after_s), *more_findings(row)]
        reasons += [
            Reason(code=REASON_CODES[finding.event], line=row.line, message=finding.message)
            for finding in findings
            if finding.event in REASON_CODES
        ]
    return reasons


def page_state(reasons: Sequence[Reason]) -> str:
    """`down`, `degraded` or `ok`, from the reasons found."""
    if any(reason.code in DOWN_CODES for reason in reasons):
        return DOWN
    return DEGRADED if reasons else OK
