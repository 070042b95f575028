"""Accepting a unit of work: journal it first, then admit it onto its line's queue.

The one path for intake requests (and, later, scheduled fires): the journal row is
committed before anything is pushed, so a 2xx always means the record is durable."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError

from app.errors import BrokerUnavailable, JournalUnavailable
from app.journal import store
from app.journal.models import Record, RecordStatus
from app.journal.store import NewRecord
from app.logs import get_logger
from app.runtime import Runtime
from app.settings import Overflow
from app.webhooks import Event

log = get_logger(__name__)

REJECTED = (RecordStatus.REJECTED,)


@dataclass(frozen=True, kw_only=True)
class Acceptance:
    """The stored record, its status after admission, and whether this call created it.

    `caller_runs` means the queue was full under that policy: the caller must now run the
    record itself (`app.runner.run_record`) before it answers."""

    record: Record
    status: RecordStatus
    created: bool
    caller_runs: bool = False


def accept(rt: Runtime, new: NewRecord, *, clock: Callable[[], datetime]) -> Acceptance:
    """Journal `new` (unless its dedup key is known) and push it onto its queue.

    Raises `JournalUnavailable` if the record could not be committed; a Redis failure
    leaves the record `received` for the sweeper and is not an error."""
    line = rt.lines.get(new.line)
    try:
        with rt.engine.begin() as conn:
            record, created = store.insert_record(conn, new, now=clock())
    except SQLAlchemyError as exc:
        raise JournalUnavailable(f"journal write failed: {type(exc).__name__}") from exc
    if not created:
        retry = record.status is RecordStatus.REJECTED and record.body_sha256 == new.body_sha256
        if not (retry and _move(rt, record, RecordStatus.RECEIVED, clock, only_from=REJECTED)):
            return Acceptance(record=record, status=record.status, created=False)
        # A rejected request sent again (as Retry-After asked): admit it again.
    log.info("record_received", record_id=record.id, line=record.line)
    try:
        pushed = rt.admission.push(
            line.queue, [record.id], max_length=line.settings.max_queue_length
        )
    except BrokerUnavailable as exc:
        log.warning("broker_down_record_kept", record_id=record.id, error=str(exc))
        return Acceptance(record=record, status=RecordStatus.RECEIVED, created=True)
    if pushed.pushed:
        _mark_enqueued(rt, record, pushed.epoch, clock)
        return Acceptance(record=record, status=RecordStatus.ENQUEUED, created=True)
    policy = line.settings.overflow
    rt.alerts.raise_event(
        Event.QUEUE_FULL,
        line=line.name,
        message=f"queue {line.queue!r} is full ({pushed.depth}/"
        f"{line.settings.max_queue_length}); policy {policy.value}",
        depth=pushed.depth,
        limit=line.settings.max_queue_length,
        policy=policy.value,
    )
    if policy is Overflow.CALLER_RUNS:
        rt.alerts.raise_event(
            Event.CALLER_RUNS,
            line=line.name,
            message=f"queue {line.queue!r} is full: the intake runs the handler itself",
        )
        return Acceptance(
            record=record, status=RecordStatus.RECEIVED, created=True, caller_runs=True
        )
    status = RecordStatus.REJECTED if policy is Overflow.REJECT else RecordStatus.DEFERRED
    if not _move(rt, record, status, clock):
        status = RecordStatus.RECEIVED  # not recorded: the sweeper will take it
    return Acceptance(record=record, status=status, created=True)


def _mark_enqueued(rt: Runtime, record: Record, epoch: str, clock: Callable[[], datetime]) -> None:
    """`received → enqueued`; on failure the record stays `received` (see `_move`)."""
    try:
        with rt.engine.begin() as conn:
            store.mark_enqueued(
                conn, [record.id], epoch=epoch, only_from=[RecordStatus.RECEIVED], now=clock()
            )
    except SQLAlchemyError as exc:
        log.warning("record_status_not_saved", record_id=record.id, error=str(exc))


def _move(
    rt: Runtime,
    record: Record,
    to: RecordStatus,
    clock: Callable[[], datetime],
    *,
    only_from: tuple[RecordStatus, ...] = (RecordStatus.RECEIVED,),
) -> bool:
    """`received → to`; whether it was written. A failure here loses nothing: the record
    stays `received` and the sweeper pushes it (a second message for a done one does
    nothing)."""
    try:
        with rt.engine.begin() as conn:
            moved = store.set_status(conn, [record.id], to, only_from=only_from, now=clock())
    except SQLAlchemyError as exc:
        log.warning("record_status_not_saved", record_id=record.id, to=to.value, error=str(exc))
        return False
    return moved == 1
