"""The sweeper (DESIGN §6): puts back on their queue the records that should be there.

Run by the active beat, in its own process, every few seconds. Records are claimed
(`… → enqueued`, guarded by the status they were seen in) before they are pushed, and
put back if the push does not happen, so two sweepers never lose a record."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy.exc import SQLAlchemyError

from app.errors import BrokerUnavailable, JournalUnavailable, UnknownLine
from app.journal import store
from app.journal.models import Record, RecordStatus
from app.logs import get_logger
from app.runtime import Runtime

log = get_logger(__name__)


@dataclass(kw_only=True)
class SweepResult:
    """What one sweep did, per line."""

    enqueued: dict[str, int] = field(default_factory=dict)
    deferred: dict[str, int] = field(default_factory=dict)
    broker_down: bool = False


def sweep(rt: Runtime, *, now: datetime) -> SweepResult:
    """One pass over the journal. Raises `JournalUnavailable`; never `BrokerUnavailable`
    (records whose push failed stay as they were, for the next pass)."""
    grace = timedelta(seconds=rt.settings.received_grace_seconds)
    try:
        with rt.engine.begin() as conn:
            due = store.due_for_enqueue(
                conn, now=now, received_before=now - grace, limit=rt.settings.sweep_batch_size
            )
    except SQLAlchemyError as exc:
        raise JournalUnavailable(f"sweep query failed: {exc}") from exc
    by_line: dict[str, list[Record]] = defaultdict(list)
    for record in due:
        by_line[record.line].append(record)
    result = SweepResult()
    for line_name, batch in by_line.items():
        try:
            _sweep_line(rt, line_name, batch, now=now, result=result)
        except BrokerUnavailable as exc:
            result.broker_down = True
            log.warning("sweep_broker_down", line=line_name, error=str(exc))
            break
        except UnknownLine:
            log.warning("sweep_unknown_line", line=line_name, records=len(batch))
    if result.enqueued or result.deferred:
        log.info("sweep_finished", enqueued=result.enqueued, deferred=result.deferred)
    return result


def _sweep_line(
    rt: Runtime, line_name: str, batch: list[Record], *, now: datetime, result: SweepResult
) -> None:
    line = rt.lines.get(line_name)
    claimed: list[Record] = []
    try:
        with rt.engine.begin() as conn:
            for record in batch:
                moved = store.set_status(
                    conn, [record.id], RecordStatus.ENQUEUED, only_from=[record.status], now=now
                )
                if moved:
                    claimed.append(record)
    except SQLAlchemyError as exc:
        raise JournalUnavailable(f"sweep claim failed: {exc}") from exc
    if not claimed:
        return
    ids = [record.id for record in claimed]
    try:
        pushed = rt.admission.push(
            line.queue, ids, max_length=line.settings.max_queue_length
        ).pushed
    except BrokerUnavailable:
        _put_back(rt, claimed, now=now)
        raise
    left = ids[pushed:]
    if left:
        with rt.engine.begin() as conn:
            store.set_status(
                conn, left, RecordStatus.DEFERRED, only_from=[RecordStatus.ENQUEUED], now=now
            )
        result.deferred[line_name] = len(left)
    if pushed:
        result.enqueued[line_name] = pushed


def _put_back(rt: Runtime, claimed: list[Record], *, now: datetime) -> None:
    """Return claimed records to the status they were claimed from."""
    with rt.engine.begin() as conn:
        for record in claimed:
            store.set_status(
                conn, [record.id], record.status, only_from=[RecordStatus.ENQUEUED], now=now
            )
