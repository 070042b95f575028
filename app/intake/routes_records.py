"""The admin endpoints that find records and act on them: the list by filter (each record
with its last attempt), a retry or a cancel of one record, and the same in bulk by filter
or by a selection of ids (with a dry run)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from app.clock import utcnow
from app.intake.admin import AdminActor
from app.intake.admin import require_admin as _require_admin
from app.intake.routes import ADMIN, RuntimeDep, Text, UtcTime, errors_doc, open_circuits
from app.intake.views import record_view
from app.journal import attempt_log, store
from app.journal.audit import MAX_REASON_LENGTH
from app.journal.models import RecordStatus, Source
from app.journal.store import RecordFilter
from app.recovery.record_actions import BulkCounts, RecordActions, check_filter
from app.wiring.runtime import Runtime

router = APIRouter(dependencies=[Depends(_require_admin)])

# How long the words searched for in errors may be: `last_error` keeps 2,000 characters,
# words that long name one error.
MAX_ERROR_TEXT = 500
# How many records a selection by ids names at most.
MAX_SELECTED = 1000
# No line allows more attempts than this; a bound above it is a typo.
MAX_ATTEMPTS_FILTER = 1_000_000
RecordId = Annotated[str, Path(max_length=128, pattern=r"^[^\x00]*$")]
Reason = Annotated[
    Text, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_REASON_LENGTH)
]
ErrorText = Annotated[Text, StringConstraints(min_length=1, max_length=MAX_ERROR_TEXT)]
AttemptBound = Annotated[int, Field(ge=0, le=MAX_ATTEMPTS_FILTER)]
SelectedId = Annotated[Text, StringConstraints(min_length=1, max_length=26)]
ERROR_DOC = (
    "words last_error holds anywhere, in any case, as plain text (% and _ match only themselves)"
)


class Order(StrEnum):
    """The order of `GET /v1/records`: by id (ids are time-ordered)."""

    OLDEST = "oldest"
    NEWEST = "newest"


def _actions(rt: Runtime) -> RecordActions:
    return RecordActions(journal=rt.journal, pusher=rt.pusher, lines=rt.lines, paused=rt.paused)


@router.get("/v1/records", responses=errors_doc(*ADMIN))
def list_records(  # noqa: PLR0913 - the filters of the query string, one argument each
    rt: RuntimeDep,
    line: Annotated[Text | None, Query(max_length=32)] = None,
    status: Annotated[list[RecordStatus] | None, Query()] = None,
    source: Source | None = None,
    business_no: Annotated[list[Text] | None, Query(max_length=128)] = None,
    since: UtcTime | None = None,
    until: UtcTime | None = None,
    error: Annotated[ErrorText | None, Query(description=ERROR_DOC)] = None,
    min_attempts: Annotated[AttemptBound | None, Query()] = None,
    max_attempts: Annotated[AttemptBound | None, Query()] = None,
    record_id: Annotated[
        list[SelectedId] | None,
        Query(alias="id", max_length=MAX_SELECTED, description="the records selected by id"),
    ] = None,
    order: Annotated[Order, Query(description="by id: oldest or newest first")] = Order.OLDEST,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[Text | None, Query(max_length=26)] = None,
    include_payload: Annotated[
        bool, Query(description="false: each payload's size only (`payload_bytes`)")
    ] = True,
) -> dict[str, Any]:
    """Records by id (`order`: oldest or newest first), filtered, each with its last attempt
    (`last_attempt`, its answer's start only; null: none yet); `next` is the cursor for the
    following page (null: no more). A search by `error` reads a bounded number of records
    with an error per page: a page may hold fewer than `limit` records, none even, while
    `next` says where to go on from."""
    where = RecordFilter(
        ids=record_id or (),
        line=line,
        statuses=status or (),
        source=source,
        business_nos=business_no or (),
        since=since,
        until=until,
        error_text=error,
        min_attempts=min_attempts,
        max_attempts=max_attempts,
    )
    check_filter(where)
    with rt.journal.reading() as conn:
        page = store.find_records(
            conn, where, limit=limit, after=after, newest=order is Order.NEWEST
        )
        last = attempt_log.last_attempts(conn, [record.id for record in page.items])
    items = []
    down = open_circuits(rt, page.items)
    for record in page.items:
        attempt = last.get(record.id)
        view = record_view(record, include_payload=include_payload, open_circuits=down)
        items.append(view | {"last_attempt": None if attempt is None else attempt.summary()})
    return {"items": items, "next": page.next}


class RetryBody(BaseModel):
    """The body of `POST /v1/records/{id}/retry` (optional)."""

    model_config = ConfigDict(extra="forbid")

    reason: Reason | None = None


class CancelBody(BaseModel):
    """The body of `POST /v1/records/{id}/cancel`."""

    model_config = ConfigDict(extra="forbid")

    reason: Reason


class Selection(BaseModel):
    """The filter of a bulk action: the filters of `GET /v1/records` (at least one), `ids`
    the selection by id."""

    model_config = ConfigDict(extra="forbid")

    ids: list[SelectedId] = Field(default_factory=list, max_length=MAX_SELECTED)
    line: Annotated[Text, Field(max_length=32)] | None = None
    status: list[RecordStatus] = Field(default_factory=list, max_length=len(RecordStatus))
    source: Source | None = None
    business_no: list[Annotated[Text, Field(max_length=128)]] = Field(
        default_factory=list, max_length=10_000
    )
    since: UtcTime | None = None
    until: UtcTime | None = None
    error: ErrorText | None = Field(default=None, description=ERROR_DOC)
    min_attempts: AttemptBound | None = None
    max_attempts: AttemptBound | None = None
    dry_run: bool = False

    def record_filter(self) -> RecordFilter:
        return RecordFilter(
            ids=self.ids,
            line=self.line,
            statuses=self.status,
            source=self.source,
            business_nos=self.business_no,
            since=self.since,
            until=self.until,
            error_text=self.error,
            min_attempts=self.min_attempts,
            max_attempts=self.max_attempts,
        )


class BulkRetryBody(Selection):
    """The body of `POST /v1/records/retry`."""

    reason: Reason | None = None


class BulkCancelBody(Selection):
    """The body of `POST /v1/records/cancel`: a reason is required."""

    reason: Reason


@router.post("/v1/records/retry", responses=errors_doc(*ADMIN))
def retry_matching(body: BulkRetryBody, rt: RuntimeDep, actor: AdminActor) -> dict[str, Any]:
    """Retry every `failed`, `dead` or `rejected` record the filter selects that is not in
    flight; `dry_run`: only count them."""
    counts = _actions(rt).bulk(
        body.record_filter(),
        cancel=False,
        dry_run=body.dry_run,
        actor=actor,
        reason=body.reason,
        clock=utcnow,
    )
    answer = _bulk_answer(counts, acted="retried")
    dry = counts.dry_run
    return answer | {
        "enqueued": None if dry else counts.enqueued,
        "deferred": None if dry else counts.deferred,
        "skipped_unknown_line": counts.skipped_unknown_line,
    }


@router.post("/v1/records/cancel", responses=errors_doc(*ADMIN))
def cancel_matching(body: BulkCancelBody, rt: RuntimeDep, actor: AdminActor) -> dict[str, Any]:
    """Cancel every unfinished record the filter selects that is not in flight; `dry_run`:
    only count them."""
    counts = _actions(rt).bulk(
        body.record_filter(),
        cancel=True,
        dry_run=body.dry_run,
        actor=actor,
        reason=body.reason,
        clock=utcnow,
    )
    return _bulk_answer(counts, acted="cancelled")


def _bulk_answer(counts: BulkCounts, *, acted: str) -> dict[str, Any]:
    return {
        "dry_run": counts.dry_run,
        "matched": counts.matched,
        acted: counts.acted,
        "skipped_status": counts.skipped_status,
        "skipped_in_flight": counts.skipped_in_flight,
    }


@router.post("/v1/records/{record_id}/retry", responses=errors_doc(*ADMIN, 404, 409))
def retry_record(
    record_id: RecordId, rt: RuntimeDep, actor: AdminActor, body: RetryBody | None = None
) -> dict[str, Any]:
    """Put a `failed`, `dead` or `rejected` record back on its queue now: the record,
    `enqueued` (or `deferred` when its queue is full). 409 when its status is another or
    it is in flight."""
    reason = body.reason if body else None
    record = _actions(rt).retry(record_id, actor=actor, reason=reason, now=utcnow())
    return record_view(record)


@router.post("/v1/records/{record_id}/cancel", responses=errors_doc(*ADMIN, 404, 409))
def cancel_record(
    record_id: RecordId, body: CancelBody, rt: RuntimeDep, actor: AdminActor
) -> dict[str, Any]:
    """Cancel an unfinished record: the record, `cancelled` (final, never delivered). 409
    when it is finished or in flight."""
    record = _actions(rt).cancel(record_id, actor=actor, reason=body.reason, now=utcnow())
    return record_view(record)
