"""Cron schedules in the database: validation and storage. The caller owns the
transaction. Beat reads them every tick; the CLI writes them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, delete, insert, or_, select, update

from app.errors import InvalidSchedule, ScheduleNotFound
from app.journal.models import schedules
from app.lines import LineRegistry
from app.schedules.cron import Misfire, check_cron, check_timezone, next_fire

NAME_PATTERN_MAX = 128


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """One schedule, as stored."""

    name: str
    cron: str
    timezone: str
    line: str
    payload: dict[str, Any]
    enabled: bool
    misfire: Misfire
    catchup_window_s: int
    last_fire_at: datetime | None
    next_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Schedule:
        data = dict(row._mapping)
        data["misfire"] = Misfire(data["misfire"])
        return cls(**data)


def fire_payload(schedule: Schedule, fire: datetime) -> dict[str, Any]:
    """The payload of the record a fire makes: the schedule's, with a `business_no`
    (the schedule's own, else `name:fire time`) and the fire time."""
    stamp = fire.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    payload = dict(schedule.payload)
    payload.setdefault("business_no", f"{schedule.name}:{stamp}"[:128])
    payload["scheduled_for"] = fire.astimezone(UTC).isoformat()
    payload.setdefault("occurred_at", fire.astimezone(UTC).isoformat())
    return payload


def validate(
    lines: LineRegistry,
    *,
    name: str,
    cron: str,
    timezone: str,
    line: str,
    payload: str | dict[str, Any],
    misfire: str,
) -> tuple[str, dict[str, Any], Misfire]:
    """Check every part of a schedule. Raises `InvalidSchedule` with one clear line."""
    if not name or len(name) > NAME_PATTERN_MAX or any(c.isspace() for c in name):
        raise InvalidSchedule(f"name {name!r}: 1 to 128 characters, no spaces")
    try:
        normalised = check_cron(cron)
        check_timezone(timezone)
        policy = Misfire(misfire)
    except ValueError as exc:
        raise InvalidSchedule(str(exc)) from None
    try:
        spec = lines.get(line)
    except Exception as exc:  # noqa: BLE001 - UnknownLine, said as a schedule error
        raise InvalidSchedule(str(exc)) from None
    if isinstance(payload, str):
        try:
            payload = json.loads(payload)
        except ValueError:
            raise InvalidSchedule("--payload is not valid JSON") from None
    if not isinstance(payload, dict):
        raise InvalidSchedule("--payload must be a JSON object")
    sample = Schedule(
        name=name,
        cron=normalised,
        timezone=timezone,
        line=line,
        payload=payload,
        enabled=True,
        misfire=policy,
        catchup_window_s=0,
        last_fire_at=None,
        next_fire_at=None,
        created_at=datetime.now(UTC),
        updated_at=datetime.now(UTC),
    )
    try:
        spec.schema.model_validate(fire_payload(sample, datetime.now(UTC)))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "payload"
        raise InvalidSchedule(
            f"--payload is not valid for line {line!r}: {where}: {first['msg']}"
        ) from None
    return normalised, payload, policy


def add(  # noqa: PLR0913 - one keyword-only value per column of a schedule
    conn: Connection,
    *,
    name: str,
    cron: str,
    timezone: str,
    line: str,
    payload: dict[str, Any],
    misfire: Misfire,
    catchup_window_s: int,
    now: datetime,
    replace: bool = False,
) -> bool:
    """Store a (validated) schedule; with `replace`, change the one of that name. Returns
    whether one was changed (else one was added)."""
    values = {
        "cron": cron,
        "timezone": timezone,
        "line": line,
        "payload": payload,
        "misfire": misfire.value,
        "catchup_window_s": catchup_window_s,
        "next_fire_at": next_fire(cron, timezone, after=now),
        "updated_at": now,
    }
    exists = conn.execute(select(schedules.c.name).where(schedules.c.name == name)).first()
    if exists and not replace:
        raise InvalidSchedule(f"schedule {name!r} exists (use --replace to change it)")
    if exists:
        conn.execute(update(schedules).where(schedules.c.name == name).values(**values))
        return True
    conn.execute(insert(schedules).values(name=name, enabled=True, created_at=now, **values))
    return False


def remove(conn: Connection, name: str) -> None:
    if conn.execute(delete(schedules).where(schedules.c.name == name)).rowcount != 1:
        raise ScheduleNotFound(f"no schedule {name!r}")


def set_enabled(conn: Connection, name: str, *, enabled: bool, now: datetime) -> None:
    # Enabling starts from now: it does not catch up on the time it was disabled.
    values: dict[str, Any] = {"enabled": enabled, "updated_at": now}
    if enabled:
        values["last_fire_at"] = now
    result = conn.execute(update(schedules).where(schedules.c.name == name).values(**values))
    if result.rowcount != 1:
        raise ScheduleNotFound(f"no schedule {name!r}")


def list_all(conn: Connection, *, enabled_only: bool = False) -> list[Schedule]:
    query = select(schedules).order_by(schedules.c.name)
    if enabled_only:
        query = query.where(schedules.c.enabled.is_(True))
    return [Schedule.from_row(row) for row in conn.execute(query)]


def record_fired(
    conn: Connection, name: str, *, through: datetime, next_at: datetime | None, now: datetime
) -> None:
    """Move the schedule's last fire forward to `through` (never backwards)."""
    conn.execute(
        update(schedules)
        .where(
            schedules.c.name == name,
            or_(schedules.c.last_fire_at.is_(None), schedules.c.last_fire_at < through),
        )
        .values(last_fire_at=through, next_fire_at=next_at, updated_at=now)
    )


def get(conn: Connection, name: str) -> Schedule:
    """The schedule named `name`. Raises `ScheduleNotFound`."""
    row = conn.execute(select(schedules).where(schedules.c.name == name)).first()
    if row is None:
        raise ScheduleNotFound(f"no schedule {name!r}")
    return Schedule.from_row(row)
