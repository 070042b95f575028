"""The intake's endpoints."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Security
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match, Route
from starlette.types import Scope

from app.admission.accept import Enqueued
from app.admission.intake_path import Admission
from app.clock import as_utc, utcnow
from app.errors import (
    BrokerUnavailable,
    JournalUnavailable,
    LineNotServed,
    NonceReused,
    NotReady,
    QueueFull,
    RecordNotFound,
)
from app.ids import DEV, digest, new_id
from app.intake.admin import AdminActor, require_admin
from app.intake.body import parse_payload
from app.intake.caller_runs import run_in_request
from app.intake.openapi_doc import RECORD_BODY, REQUEST_SIGNATURE
from app.intake.pacing import IntakePacers
from app.intake.signing import MAX_NONCE_LENGTH, Caller, verify
from app.intake.views import alert_view, line_status_view, record_view
from app.journal import attempt_log, audit, store
from app.journal.commits import CommitQueue
from app.journal.models import Record, RecordStatus, Source
from app.journal.store import NewRecord
from app.observe.metrics import CONTENT_TYPE, render
from app.recovery.replay import DEFAULT_STATUSES, ReplayFilter
from app.telemetry.counters import RECENT_ALERTS, Counter, IntakeOutcome
from app.telemetry.incidents import history
from app.telemetry.tracing import current_traceparent
from app.wiring.runtime import Runtime

router = APIRouter()
_OUTCOME_BY_STATUS = {
    RecordStatus.ENQUEUED: IntakeOutcome.ACCEPTED,
    RecordStatus.RECEIVED: IntakeOutcome.RECEIVED,
    RecordStatus.DEFERRED: IntakeOutcome.DEFERRED,
    RecordStatus.REJECTED: IntakeOutcome.REJECTED,
}
# The audit rows a record's detail shows, newest first: a record is acted on a few times.
RECORD_AUDIT_ROWS = 50
# A rejected record's caller is asked to wait this long: a queue drains in seconds.
QUEUE_FULL_RETRY_AFTER_S = 5


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    """Every error answer."""

    error: ErrorDetail


def _in_utc(value: datetime) -> datetime:
    try:
        return as_utc(value)
    except OverflowError:
        raise ValueError("the time has no UTC equivalent") from None


# What filters take: text no database refuses (PostgreSQL refuses NUL), and times that
# exist in UTC.
Text = Annotated[str, StringConstraints(pattern=r"^[^\x00]*$")]
UtcTime = Annotated[datetime, AfterValidator(_in_utc)]


def errors_doc(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error answers an endpoint gives."""
    return {status: {"model": ErrorBody} for status in statuses}


# What any endpoint may answer: a malformed request, a state-changing request of another
# site's page, a body too slow, too large or not JSON, a bad query or body, headers too
# large, a request too many in flight.
COMMON = (400, 403, 408, 413, 415, 422, 431, 503)
ADMIN = (*COMMON, 401, 403)
RECORD_ANSWER = {
    200: {"description": "a known nonce: the original record; or done under caller_runs"},
    # 421: another intake takes the line (PIPELINE_INTAKE_LINES); 429: a full queue, or the
    # line's rate.
    **errors_doc(*COMMON, 401, 404, 409, 413, 421, 429),
}


async def runtime(request: Request) -> Runtime:
    # async: a plain `def` dependency would cost every request a trip to the thread pool.
    rt: Runtime = request.app.state.runtime
    return rt


RuntimeDep = Annotated[Runtime, Depends(runtime)]


def _caller(request: Request, rt: Runtime, body: bytes) -> Caller:
    if rt.settings.in_dev_mode:
        # A Standard Webhooks sender's webhook-id is its nonce: its retries stay one record.
        headers = request.headers
        nonce = headers.get("x-nonce") or headers.get("webhook-id") or new_id(utcnow())
        return Caller(key_id=DEV, nonce=nonce[:MAX_NONCE_LENGTH])
    return verify(
        request.headers,
        body,
        keys=rt.settings.intake_keys,
        now_s=time.time(),
        window_s=rt.settings.timestamp_window_seconds,
    )


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """200 while the process serves; touches no dependency."""
    return {"status": "ok"}


@router.get("/readyz", responses=errors_doc(503))
def readyz(rt: RuntimeDep) -> JSONResponse:
    """200 when Redis and the journal answer, else 503 naming what failed."""
    failed: list[str] = []
    try:
        rt.redis.ping()
    except Exception:  # noqa: BLE001 - any failure means not ready
        failed.append("redis")
    try:
        with rt.journal.reading() as conn:
            conn.execute(text("SELECT 1"))
    except JournalUnavailable:
        failed.append("journal")
    if failed:
        raise NotReady(f"unavailable: {', '.join(failed)}", failed=failed)
    return JSONResponse({"status": "ready"})


@router.get("/v1/lines", responses=errors_doc(*COMMON))
def lines(rt: RuntimeDep) -> dict[str, Any]:
    """Per line: queue depth and bound, policy, live workers, counts, oldest unfinished age."""
    rows = rt.view.line_statuses(now=utcnow())
    return {"lines": [line_status_view(row) for row in rows]}


@router.get("/v1/alerts", dependencies=[Depends(require_admin)], responses=errors_doc(*ADMIN))
def alerts(
    rt: RuntimeDep,
    limit: Annotated[int, Query(ge=1, le=RECENT_ALERTS)] = 20,
    dry_run: Annotated[
        bool | None,
        Query(description="true: only the alerts of dry runs; false: none of them"),
    ] = None,
) -> dict[str, Any]:
    """The incidents (condition alerts: `open` or `resolved`, with when they opened, were
    last raised and resolved, and how long they lasted) and the point events (`state`
    `event`: a record died, a replay finished…): the open incidents first, then the rest,
    each part newest change first, so that `limit` never hides an incident still open
    (admin: they name records, business numbers and actors). Each has its reason (the
    message), its figures (numbers and names, never an error's text) and whether a dry run
    raised it."""
    try:
        items = history(rt.redis)
    except BrokerUnavailable as exc:
        raise BrokerUnavailable("the alert history is unavailable") from exc
    now = utcnow()
    shown = [alert_view(item, now=now) for item in items]
    shown.sort(key=lambda alert: (alert["state"] == "open", str(alert["time"] or "")), reverse=True)
    if dry_run is not None:
        shown = [alert for alert in shown if alert["dry_run"] is dry_run]
    return {"alerts": shown[:limit]}


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        200: {
            "description": "Prometheus text",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **errors_doc(*COMMON),
    },
)
async def metrics(rt: RuntimeDep) -> Response:
    """Prometheus text: per line queue depth and bound, records by status, counters."""
    body = await run_in_threadpool(render, rt.view, now=utcnow())
    return Response(body, media_type=CONTENT_TYPE)


@router.get(
    "/v1/records/{record_id}",
    dependencies=[Depends(require_admin)],
    responses=errors_doc(*ADMIN, 404),
)
def get_record(
    record_id: Annotated[str, Path(max_length=128, pattern=r"^[^\x00]*$")],
    rt: RuntimeDep,
    include_payload: Annotated[
        bool, Query(description="false: the payload's size only (`payload_bytes`)")
    ] = True,
) -> dict[str, Any]:
    """The record, with its attempts (`attempt_history`, oldest first), its payload's size
    and the audit rows about it (`audit`, newest first)."""
    with rt.journal.reading() as conn:
        record = store.get_record(conn, record_id)
        if record is None:
            raise RecordNotFound(f"no record {record_id!r}")
        history = attempt_log.history(conn, record_id)
        rows = audit.newest(conn, limit=RECORD_AUDIT_ROWS, target=f"record:{record_id}")
    down = open_circuits(rt, [record])
    view = record_view(record, history, include_payload=include_payload, open_circuits=down)
    view["audit"] = [row.public() for row in rows]
    return view


class ReplayRequest(BaseModel):
    """The body of `POST /v1/replay`."""

    model_config = ConfigDict(extra="forbid")

    line: Annotated[Text, Field(max_length=32)] | None = None
    since: UtcTime | None = None
    until: UtcTime | None = None
    business_nos: list[Annotated[Text, Field(max_length=128)]] = Field(
        default_factory=list, max_length=10_000
    )
    statuses: list[RecordStatus] = Field(default_factory=list)
    dry_run: bool = False
    # Why, for the audit log.
    reason: Annotated[Text, Field(max_length=500)] | None = None


@router.post("/v1/replay", responses=errors_doc(*ADMIN, 404))
async def post_replay(body: ReplayRequest, actor: AdminActor, rt: RuntimeDep) -> dict[str, Any]:
    """Replay records (admin): counts matched / enqueued / deferred / skipped (already
    done, already downstream, in flight). A real run is audited as the token's actor; a
    dry run only counts."""
    if body.line is not None:
        rt.lines.get(body.line)
    where = ReplayFilter(
        line=body.line,
        since=body.since,
        until=body.until,
        business_nos=body.business_nos,
        statuses=body.statuses or DEFAULT_STATUSES,
    )
    counts = await run_in_threadpool(
        functools.partial(
            rt.replayer.replay,
            where,
            dry_run=body.dry_run,
            actor=actor,
            reason=body.reason,
            clock=utcnow,
        )
    )
    return {
        "matched": counts.matched,
        "enqueued": counts.enqueued,
        "deferred": counts.deferred,
        "skipped_already_done": counts.skipped_done,
        "skipped_already_synced": counts.skipped_synced,
        "skipped_in_flight": counts.skipped_in_flight,
        "dry_run": body.dry_run,
    }


@router.post(
    "/v1/{line}",
    status_code=202,
    openapi_extra=RECORD_BODY,
    responses=RECORD_ANSWER,
    # REQUEST_SIGNATURE only declares the signature in the OpenAPI document (`_caller`
    # checks it, after reading the body).
    dependencies=[Security(REQUEST_SIGNATURE)],
)
async def post_record(request: Request) -> JSONResponse:
    """Journal a record for the path's line, then push it onto the line's queue.

    Served as a plain Starlette route (`record_route`), which nearly every request takes:
    it skips FastAPI's dependency solving and handler wrappers, about a third of the
    intake's CPU per request. This FastAPI route documents it (OpenAPI), and would serve it
    the same way."""
    line: str = request.path_params["line"]
    # Its answers and refusals are counted (`app.intake.errors.count_outcome`).
    request.state.count_outcomes = True
    rt: Runtime = request.app.state.runtime
    body = await request.body()  # read whole, within its limits, by the gate
    caller = _caller(request, rt, body)
    spec = rt.lines.get(line)
    served = rt.settings.intake_lines
    if served is not None and spec.name not in served:
        raise LineNotServed(
            f"this intake takes the records of {', '.join(served)}, not of {spec.name}: "
            "another intake takes them (PIPELINE_INTAKE_LINES)",
            served=served,
        )
    payload = parse_payload(body, spec.schema)
    pacers: IntakePacers = request.app.state.pacers
    # Over the sender's or the line's intake rate: wait, or 429 (RateLimited).
    await pacers.admit(spec.name, caller.key_id)
    now = utcnow()
    new = NewRecord(
        id=new_id(now),
        line=spec.name,
        business_no=payload["business_no"],
        source=Source.INTAKE,
        dedup_key=caller.dedup_key,
        body_sha256=digest(body),
        payload=payload,
        traceparent=current_traceparent(rt.tracer),
    )
    group: CommitQueue[Admission | Enqueued, Admission | None] = request.app.state.group_accept
    admission = await group.put(Admission(new))  # committed: from here on the answer is 2xx
    assert admission is not None  # an admission's answer is itself
    record = admission.record
    if not admission.created and record.line != new.line:
        # Not the other line's record: that would tell this caller what it holds.
        raise NonceReused("this nonce was already used for another line")
    if not admission.created and record.body_sha256 != new.body_sha256:
        raise NonceReused("this nonce was already used with a different body")
    result = await admission.acceptance(
        wait_s=rt.settings.intake_push_wait_seconds,
        journal_wait_s=rt.settings.journal_timeout_seconds,
    )
    ran = await run_in_request(request, rt, spec, record.id) if result.caller_runs else None
    status = ran or result.status
    outcome = _OUTCOME_BY_STATUS.get(status, IntakeOutcome.ACCEPTED)
    if not result.created:
        outcome = IntakeOutcome.DUPLICATE
    elif ran is not None:
        outcome = IntakeOutcome.CALLER_RUN
    rt.telemetry.count(Counter.INTAKE, line=spec.name, outcome=outcome.value)
    answer = {
        "id": record.id,
        "line": record.line,
        "business_no": record.business_no,
        "status": status.value,
    }
    if status is RecordStatus.REJECTED:
        raise QueueFull(f"line {line!r} is full", retry_after_s=QUEUE_FULL_RETRY_AFTER_S, **answer)
    done = status is RecordStatus.DONE
    return JSONResponse(answer, status_code=200 if (done or not result.created) else 202)


class _RecordRoute(Route):
    """`post_record` for the configured lines' paths only (line names never spell another
    route's path: `RESERVED_LINE_NAMES`); any other `POST /v1/…` goes on to FastAPI's
    routes (`/v1/replay`, an unknown line's 404). Named in the scope as FastAPI's routes
    are (`scope["route"]`: a request's span is named after its route's template)."""

    def __init__(self, lines: frozenset[str]) -> None:
        super().__init__("/v1/{line}", post_record, methods=["POST"], include_in_schema=False)
        self.lines = lines

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is Match.NONE or child["path_params"].get("line") not in self.lines:
            return Match.NONE, {}
        child["route"] = self
        return match, child


def record_route(lines: Iterable[str]) -> Route:
    """`post_record` as the intake serves it, placed before every other route of the app."""
    return _RecordRoute(frozenset(lines))


def open_circuits(rt: Runtime, shown: Sequence[Record]) -> frozenset[str]:
    """The lines with an open circuit, asked of Redis only when a failed record is shown
    (it then waits for its downstream)."""
    if not any(record.status is RecordStatus.FAILED for record in shown):
        return frozenset()
    return rt.circuits.open_among(rt.lines.http_sink_names())
