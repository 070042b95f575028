"""Accepting a unit of work: journal it first, then admit it onto its line's queue.

The one path for intake requests (and, later, scheduled fires): the journal row is
committed before anything is pushed, so a 2xx always means the record is durable."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError

from app.errors import BrokerUnavailable, JournalUnavailable
from app.journal import store
from app.journal.models import Record, RecordStatus
from app.journal.store import NewRecord
from app.logs import get_logger
from app.runner import run_record
from app.runtime import Runtime
from app.settings import Overflow

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class Acceptance:
    """The stored record, its status after admission, and whether this call created it."""

    record: Record
    status: RecordStatus
    created: bool


def accept(
    rt: Runtime,
    new: NewRecord,
    *,
    clock: Callable[[], datetime],
    rng: random.Random,
) -> Acceptance:
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
        return Acceptance(record=record, status=record.status, created=False)
    log.info("record_received", record_id=record.id, line=record.line)
    try:
        pushed = rt.admission.push(
            line.queue, [record.id], max_length=line.settings.max_queue_length
        )
    except BrokerUnavailable as exc:
        log.warning("broker_down_record_kept", record_id=record.id, error=str(exc))
        return Acceptance(record=record, status=RecordStatus.RECEIVED, created=True)
    if pushed.pushed:
        status = RecordStatus.ENQUEUED
        _move(rt, record, status, clock)
    else:
        status = _overflow(rt, record, line.settings.overflow, clock=clock, rng=rng)
        log.warning(
            "queue_full",
            record_id=record.id,
            line=record.line,
            depth=pushed.depth,
            limit=line.settings.max_queue_length,
            policy=line.settings.overflow.value,
        )
    return Acceptance(record=record, status=status, created=True)


def _move(rt: Runtime, record: Record, to: RecordStatus, clock: Callable[[], datetime]) -> None:
    """`received → to`. A failure here loses nothing: the record stays `received` and the
    sweeper pushes it again (a second message for a done record does nothing)."""
    try:
        with rt.engine.begin() as conn:
            store.set_status(conn, [record.id], to, only_from=[RecordStatus.RECEIVED], now=clock())
    except SQLAlchemyError as exc:
        log.warning("record_status_not_saved", record_id=record.id, to=to.value, error=str(exc))


def _overflow(
    rt: Runtime,
    record: Record,
    policy: Overflow,
    *,
    clock: Callable[[], datetime],
    rng: random.Random,
) -> RecordStatus:
    if policy is Overflow.REJECT:
        _move(rt, record, RecordStatus.REJECTED, clock)
        return RecordStatus.REJECTED
    if policy is Overflow.CALLER_RUNS:
        log.warning("caller_runs", record_id=record.id, line=record.line)
        return run_record(rt, record.id, clock=clock, rng=rng) or RecordStatus.RECEIVED
    _move(rt, record, RecordStatus.DEFERRED, clock)
    return RecordStatus.DEFERRED
