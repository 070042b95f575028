"""The reads the operator's console polls besides `/v1/lines` and `/v1/alerts`: the health
of the pipeline's parts and the done/failed counts per minute, and the console itself (its
page at `/` and its scripts and styles under `/console/`, all served from this package)."""

from __future__ import annotations

from datetime import datetime
from importlib import resources
from typing import Annotated, Any

import redis
from fastapi import APIRouter, Path, Query
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import text

from app.clock import utcnow
from app.errors import BrokerUnavailable, JournalUnavailable, NotFound
from app.intake.routes import COMMON, RuntimeDep, errors_doc
from app.observe import health
from app.observe.health import Check, Reason
from app.schedules import store as schedule_store
from app.telemetry import throughput
from app.wiring.runtime import Runtime

router = APIRouter()

STATIC = resources.files("app.intake").joinpath("static")
# The console's files, by name, and their media types: nothing else is served.
ASSETS = {
    "console.css": "text/css; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "overview.js": "text/javascript; charset=utf-8",
    "records.js": "text/javascript; charset=utf-8",
    "admin.js": "text/javascript; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
}
# The page loads nothing from elsewhere, and runs no script it did not load from here.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}


@router.get("/", include_in_schema=False)
def console_page() -> HTMLResponse:
    """The operator's console."""
    body = STATIC.joinpath("status.html").read_text(encoding="utf-8")
    return HTMLResponse(body, headers=PAGE_HEADERS)


@router.get("/console/{name}", include_in_schema=False)
def console_asset(name: Annotated[str, Path(max_length=64)]) -> Response:
    """One of the console's scripts or styles."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFound(f"no console file {name!r}")
    body = STATIC.joinpath(name).read_bytes()
    return Response(body, media_type=media_type, headers=PAGE_HEADERS)


def _redis_check(rt: Runtime) -> tuple[Check, health.BeatState | None]:
    try:
        rt.redis.ping()
        state = health.read_beat(rt.redis)
    except redis.RedisError as exc:
        reason = f"Redis does not answer ({type(exc).__name__})"
        return Check(name="redis", ok=False, reason=reason), None
    return Check(name="redis", ok=True, reason="Redis answers"), state


def _journal_checks(rt: Runtime, now: datetime) -> tuple[Check, Check]:
    try:
        with rt.journal.reading("health") as conn:
            conn.execute(text("SELECT 1"))
            schedules = schedule_store.list_all(conn)
    except JournalUnavailable as exc:
        reason = f"the journal does not answer ({exc.message})"
        unknown = Check(name="schedules", ok=False, reason="unknown: " + reason)
        return Check(name="journal", ok=False, reason=reason), unknown
    journal = Check(name="journal", ok=True, reason="the journal answers")
    return journal, health.schedules_check(schedules, now=now)


@router.get("/v1/health", responses=errors_doc(*COMMON))
def get_health(rt: RuntimeDep) -> dict[str, Any]:
    """The page's `state` and the health of each part. `state`: `down` (Redis or the journal
    does not answer: the pipeline cannot take or deliver), `degraded` (a line's circuit is
    open, a line with waiting records has no live worker, a line is paused, a worker is
    stalled, a line's backlog is past `backlog_after_seconds`, a queue is full, no beat is
    active, the sweep or a schedule is late) or `ok`; `reasons`: `{code, line, message}` for
    each trouble found. `checks`: Redis, the journal, the active beat (its host and how long
    it has held the lock), the last sweep's age and the schedules' fires, each `{name, ok,
    reason, …figures}`; `ok` is whether all are. Always 200: a part that fails is in the
    answer, with why."""
    now = utcnow()
    settings = rt.settings
    redis_check, state = _redis_check(rt)
    if state is None:
        down = "unknown: Redis does not answer"
        beat = Check(name="beat", ok=False, reason=down)
        sweep = Check(name="sweep", ok=False, reason=down)
    else:
        beat = health.beat_check(state, ttl_s=settings.beat_lock_ttl_seconds, now=now)
        sweep = health.sweep_check(
            state.last_sweep, interval_s=settings.sweep_interval_seconds, now=now
        )
    journal, schedules = _journal_checks(rt, now)
    checks = [redis_check, journal, beat, sweep, schedules]
    reasons = _reasons(rt, now, checks)
    return {
        "time": now.isoformat(),
        "state": health.page_state(reasons),
        "reasons": [reason.public() for reason in reasons],
        "ok": all(check.ok for check in checks),
        "checks": [check.public() for check in checks],
    }


# A failing check of these makes the page degraded: without an active beat nothing sweeps,
# monitors or fires; a late sweep leaves deferred and lost records where they are; a late
# schedule has missed its fire.
_DEGRADING_CHECKS = {"beat": "beat_down", "sweep": "sweep_late", "schedules": "schedules_late"}


def _reasons(rt: Runtime, now: datetime, checks: list[Check]) -> list[Reason]:
    """Why the page is not ok. With Redis or the journal away the pipeline is down, and the
    lines are not read (each read would wait out the same timeout)."""
    failed = {check.name: check for check in checks if not check.ok}
    down = [
        Reason(code=f"{name}_down", line=None, message=failed[name].reason)
        for name in ("redis", "journal")
        if name in failed
    ]
    if down:
        return down
    try:
        rows = rt.view.recent_statuses(now=now)
    except JournalUnavailable:
        return [Reason(code="journal_down", line=None, message="the journal does not answer")]
    parts = [
        Reason(code=code, line=None, message=failed[name].reason)
        for name, code in _DEGRADING_CHECKS.items()
        if name in failed
    ]
    return parts + health.line_reasons(rows, backlog_after_s=rt.settings.backlog_after_seconds)


@router.get("/v1/throughput", responses=errors_doc(*COMMON))
def get_throughput(
    rt: RuntimeDep,
    minutes: Annotated[int, Query(ge=1, le=throughput.MAX_MINUTES)] = 60,
) -> dict[str, Any]:
    """Per line, records done and attempts failed in each of the last `minutes` minutes
    (oldest first, the current minute last), summed over every worker on every host."""
    now = utcnow()
    try:
        by_line = throughput.read(rt.redis, rt.lines.names(), now=now, minutes=minutes)
    except BrokerUnavailable as exc:
        raise BrokerUnavailable("the throughput counters are unavailable") from exc
    return {
        "time": now.isoformat(),
        "minutes": minutes,
        "lines": [
            {"line": line, "per_minute": [minute.public() for minute in rows]}
            for line, rows in by_line.items()
        ],
    }
