"""The schedules, as the console shows and switches them (admin): each with its cron,
time zone, misfire policy, last and next fire; enable and disable, audited."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from app.clock import utcnow
from app.intake.admin import AdminActor, require_admin
from app.intake.routes import ADMIN, RuntimeDep, Text, errors_doc
from app.journal.audit import MAX_REASON_LENGTH
from app.schedules import actions
from app.schedules import store as schedule_store
from app.schedules.store import NAME_PATTERN_MAX, Schedule

router = APIRouter()

ScheduleName = Annotated[str, Path(min_length=1, max_length=NAME_PATTERN_MAX, pattern=r"^\S+$")]


class SwitchRequest(BaseModel):
    """The optional body of an enable or a disable."""

    model_config = ConfigDict(extra="forbid")

    reason: Annotated[Text, Field(max_length=MAX_REASON_LENGTH)] | None = None


SwitchBody = Annotated[SwitchRequest | None, Body()]


def schedule_view(schedule: Schedule, *, now: datetime) -> dict[str, Any]:
    """A schedule as the API shows it (times in ISO 8601 UTC; its payload left out).
    `late_s`: how long ago an enabled schedule's next fire fell due, when it has."""
    due = schedule.next_fire_at
    late_s = (now - due).total_seconds() if schedule.enabled and due and due < now else None
    return {
        "name": schedule.name,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "line": schedule.line,
        "enabled": schedule.enabled,
        "misfire": schedule.misfire.value,
        "catchup_window_s": schedule.catchup_window_s,
        "last_fire_at": schedule.last_fire_at.isoformat() if schedule.last_fire_at else None,
        "next_fire_at": due.isoformat() if due and schedule.enabled else None,
        "late_s": late_s,
        "updated_at": schedule.updated_at.isoformat(),
    }


@router.get("/v1/schedules", dependencies=[Depends(require_admin)], responses=errors_doc(*ADMIN))
def list_schedules(rt: RuntimeDep) -> dict[str, Any]:
    """Every schedule, by name."""
    with rt.journal.reading() as conn:
        rows = schedule_store.list_all(conn)
    now = utcnow()
    return {"items": [schedule_view(row, now=now) for row in rows]}


async def _switch(rt: Any, name: str, *, enabled: bool, actor: str, reason: str | None) -> Any:
    return await run_in_threadpool(
        lambda: actions.switch(
            rt.journal, name, enabled=enabled, actor=actor, reason=reason, now=utcnow()
        )
    )


@router.post("/v1/schedules/{name}/enable", responses=errors_doc(*ADMIN, 404))
async def enable_schedule(
    name: ScheduleName, rt: RuntimeDep, actor: AdminActor, body: SwitchBody = None
) -> dict[str, Any]:
    """Enable a schedule (admin, audited): it fires from now on, with no catch-up of the
    time it was disabled. Enabling an enabled one changes nothing."""
    reason = body.reason if body else None
    schedule = await _switch(rt, name, enabled=True, actor=actor, reason=reason)
    return schedule_view(schedule, now=utcnow())


@router.post("/v1/schedules/{name}/disable", responses=errors_doc(*ADMIN, 404))
async def disable_schedule(
    name: ScheduleName, rt: RuntimeDep, actor: AdminActor, body: SwitchBody = None
) -> dict[str, Any]:
    """Disable a schedule (admin, audited). Disabling a disabled one changes nothing."""
    reason = body.reason if body else None
    schedule = await _switch(rt, name, enabled=False, actor=actor, reason=reason)
    return schedule_view(schedule, now=utcnow())
