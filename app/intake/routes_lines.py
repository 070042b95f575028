"""The intake's endpoints that act on a line: pause and resume (admin)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from app.clock import utcnow
from app.intake.admin import AdminActor
from app.intake.routes import ADMIN, RuntimeDep, Text, errors_doc
from app.journal.audit import MAX_REASON_LENGTH

router = APIRouter()

LineName = Annotated[str, Path(max_length=32, pattern=r"^[^\x00]*$")]


class LineActionRequest(BaseModel):
    """The optional body of a pause or a resume."""

    model_config = ConfigDict(extra="forbid")

    reason: Annotated[Text, Field(max_length=MAX_REASON_LENGTH)] | None = None


LineActionBody = Annotated[LineActionRequest | None, Body()]


@router.post("/v1/lines/{line}/pause", responses=errors_doc(*ADMIN, 404))
async def pause_line(
    line: LineName, rt: RuntimeDep, actor: AdminActor, body: LineActionBody = None
) -> dict[str, Any]:
    """Pause a line (admin): its new records are journaled and answered `deferred`, no
    worker starts an attempt of it and the sweeper pushes nothing of it, within 2 s, on
    every host, until it is resumed. Pausing a paused line changes nothing."""
    reason = body.reason if body else None
    state = await run_in_threadpool(rt.pauser.pause, line, actor=actor, reason=reason, now=utcnow())
    return state.public()


@router.post("/v1/lines/{line}/resume", responses=errors_doc(*ADMIN, 404))
async def resume_line(
    line: LineName, rt: RuntimeDep, actor: AdminActor, body: LineActionBody = None
) -> dict[str, Any]:
    """Resume a paused line (admin): the records that waited are pushed first, oldest
    first, and new ones go behind them. Resuming a running line changes nothing."""
    reason = body.reason if body else None
    state = await run_in_threadpool(
        rt.pauser.resume, line, actor=actor, reason=reason, now=utcnow()
    )
    return state.public()
