"""An operator's actions on records, one by id or in bulk by filter: a retry puts a
`failed`, `dead` or `rejected` record back on its queue now, through the bounded push and
its line's bound (what does not fit waits `deferred` for the sweeper, as does what Redis,
down, could not take); a cancel makes an unfinished record `cancelled`, final and never
delivered. Neither touches a record in flight (`app.journal.operator_actions`).

Each real action writes one audit row: a single one in the transaction of its move, a
bulk one when it ends, with its counts (stopped part-way, with what it did and why it
stopped). A bulk action goes through its records in keyset pages by id, a transaction
each, so a large set is never one transaction. A dry run only counts, and writes nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from app.admission.pause import PausedLines
from app.admission.push import Pusher
from app.errors import (
    BrokerUnavailable,
    InvalidFilter,
    JournalUnavailable,
    RecordInFlight,
    RecordNotFound,
    RecordStatusConflict,
)
from app.journal import audit, claims, operator_actions, store
from app.journal.journal import Journal
from app.journal.models import Record
from app.journal.store import RecordFilter, RecordKey
from app.journal.transitions import Event
from app.lines import Line, LineRegistry
from app.telemetry.logs import get_logger

log = get_logger(__name__)

# Records per page of a bulk action: one transaction each, short enough to hold up no
# writer for long, large enough that a million records take a few thousand.
PAGE_SIZE = 500
_ACTION = {Event.RETRIED: audit.Action.RETRY, Event.CANCELLED: audit.Action.CANCEL}


@dataclass(kw_only=True)
class BulkCounts:
    """What a bulk action found and did (in a dry run: `acted` is what it would do).
    `matched`: what the filter selects; `acted`: retried or cancelled; `enqueued` and
    `deferred` (a retry): where those retried went; `skipped_status`: in a status the
    action does not take; `skipped_in_flight`: in flight, or moved meanwhile;
    `skipped_unknown_line` (a retry): of a line no longer configured."""

    dry_run: bool
    matched: int = 0
    acted: int = 0
    enqueued: int = 0
    deferred: int = 0
    skipped_status: int = 0
    skipped_in_flight: int = 0
    skipped_unknown_line: int = 0


def check_filter(where: RecordFilter, *, bulk: bool = False) -> None:
    """Refuse a contradictory filter, or (`bulk`) one that selects everything: an action
    on every record of the journal is named, never implied. Raises `InvalidFilter`."""
    if where.since and where.until and where.since >= where.until:
        raise InvalidFilter("since must be before until")
    low, high = where.min_attempts, where.max_attempts
    if low is not None and high is not None and low > high:
        raise InvalidFilter("min_attempts must not be over max_attempts")
    if bulk and not _selective(where):
        raise InvalidFilter("a bulk action needs at least one filter")


def _selective(where: RecordFilter) -> bool:
    """Whether `where` leaves any record out: at least 0 attempts and empty error words
    are true of every record, so they are no filter."""
    fields = describe(where)
    if fields.get("min_attempts") == 0:
        del fields["min_attempts"]
    if fields.get("error") == "":
        del fields["error"]
    return bool(fields)


def describe(where: RecordFilter) -> dict[str, Any]:
    """The filter's fields that select something, as the audit log keeps them."""
    fields: dict[str, Any] = {
        "ids": list(where.ids),
        "line": where.line,
        "status": [s.value for s in where.statuses],
        "source": where.source.value if where.source else None,
        "business_no": list(where.business_nos),
        "since": where.since.isoformat() if where.since else None,
        "until": where.until.isoformat() if where.until else None,
        "error": where.error_text,
        "min_attempts": where.min_attempts,
        "max_attempts": where.max_attempts,
    }
    return {name: value for name, value in fields.items() if value not in (None, [])}


@dataclass(frozen=True, kw_only=True)
class RecordActions:
    """Retries and cancels records, one or by filter, on behalf of an actor."""

    journal: Journal
    pusher: Pusher
    lines: LineRegistry
    # A retry of a paused line's record waits `deferred`, pushed after the resume.
    paused: PausedLines | None = None

    def retry(self, record_id: str, *, actor: str, reason: str | None, now: datetime) -> Record:
        """Put a `failed`, `dead` or `rejected` record back on its queue now; the record as
        it is then (`enqueued`, or `deferred` when its queue is full or Redis is down).
        Raises `RecordNotFound`, `RecordStatusConflict`, `RecordInFlight`, `UnknownLine`."""
        with self.journal.transaction("retry") as conn:
            record = _found(store.get_record(conn, record_id), record_id)
            line = self.lines.get(record.line)  # before the claim: a claim must be pushed
            claimed = operator_actions.claim_retry(conn, [record_id], now=now)
            if not claimed:
                raise _refusal(record, Event.RETRIED)
            _write_audit(conn, Event.RETRIED, record, actor=actor, reason=reason, now=now)
        self._push(line, claimed, now=now)
        with self.journal.reading() as conn:
            return _found(store.get_record(conn, record_id), record_id)

    def cancel(self, record_id: str, *, actor: str, reason: str, now: datetime) -> Record:
        """Make an unfinished record `cancelled`: final, never delivered, never swept. The
        record as cancelled. Raises `RecordNotFound`, `RecordStatusConflict`,
        `RecordInFlight`."""
        epoch = self._epoch()
        with self.journal.transaction("cancel") as conn:
            record = _found(store.get_record(conn, record_id), record_id)
            cancelled = operator_actions.cancel(conn, [record_id], epoch=epoch, now=now)
            if not cancelled:
                raise _refusal(record, Event.CANCELLED)
            _write_audit(conn, Event.CANCELLED, record, actor=actor, reason=reason, now=now)
        log.info("record_cancelled", record_id=record_id, line=record.line, actor=actor)
        return cancelled[0]

    def selected(self, where: RecordFilter, *, cancel: bool) -> int:
        """How many records `where` selects in a status the action takes (a progress bar's
        total)."""
        event = Event.CANCELLED if cancel else Event.RETRIED
        only = operator_actions.narrowed(where, event)
        if only is None:
            return 0
        with self.journal.reading() as conn:
            return store.count_records(conn, only)

    def bulk(
        self,
        where: RecordFilter,
        *,
        cancel: bool,
        dry_run: bool,
        actor: str,
        reason: str | None,
        clock: Callable[[], datetime],
        on_page: Callable[[int], None] | None = None,
    ) -> BulkCounts:
        """Retry (or `cancel`) every record `where` selects that the action takes and that
        is not in flight, a page at a time; `dry_run`: count them, change nothing. Raises
        `InvalidFilter`, `JournalUnavailable`."""
        check_filter(where, bulk=True)
        event = Event.CANCELLED if cancel else Event.RETRIED
        counts = BulkCounts(dry_run=dry_run)
        epoch = self._epoch() if cancel else None
        takes = self.selected(where, cancel=cancel)
        with self.journal.reading() as conn:
            counts.matched = store.count_records(conn, where)
            counts.skipped_status = counts.matched - takes
            if dry_run:
                counts.acted = operator_actions.count_actionable(
                    conn, where, event, epoch=epoch, now=clock()
                )
                counts.skipped_in_flight = takes - counts.acted
                return counts
        try:
            self._act_on_pages(where, counts, cancel=cancel, clock=clock, on_page=on_page)
        except BaseException as exc:
            # Stopped part-way (Ctrl-C, the journal gone): what the pages done did is done.
            self._audit_bulk(
                where,
                counts,
                event,
                actor=actor,
                reason=reason,
                now=clock(),
                error=type(exc).__name__,
            )
            raise
        self._audit_bulk(where, counts, event, actor=actor, reason=reason, now=clock())
        log.info("records_bulk_action", action=_ACTION[event].value, actor=actor, **asdict(counts))
        return counts

    def _act_on_pages(
        self,
        where: RecordFilter,
        counts: BulkCounts,
        *,
        cancel: bool,
        clock: Callable[[], datetime],
        on_page: Callable[[int], None] | None,
    ) -> None:
        event = Event.CANCELLED if cancel else Event.RETRIED
        cursor: str | None = None
        while True:
            with self.journal.reading() as conn:
                page = operator_actions.page(conn, where, event, limit=PAGE_SIZE, after=cursor)
            if not page:
                return
            cursor = page[-1].id
            if cancel:
                # Read again for each page: a Redis restarted meanwhile has another.
                self._cancel_page(page, counts, epoch=self._epoch(), now=clock())
            else:
                self._retry_page(page, counts, now=clock())
            if on_page:
                on_page(len(page))

    def _audit_bulk(
        self,
        where: RecordFilter,
        counts: BulkCounts,
        event: Event,
        *,
        actor: str,
        reason: str | None,
        now: datetime,
        error: str | None = None,
    ) -> None:
        """The bulk action's audit row, with its counts (and, stopped part-way, the
        error's name). A journal that cannot take the row only logs, loudly."""
        result: dict[str, Any] = {k: v for k, v in asdict(counts).items() if k != "dry_run"}
        if error is not None:
            result["error"] = error
        try:
            with self.journal.transaction("audit") as conn:
                audit.write(
                    conn,
                    actor=actor,
                    action=_ACTION[event],
                    target=f"line:{where.line or '*'}",
                    params=describe(where),
                    result=result,
                    reason=reason,
                    now=now,
                )
        except JournalUnavailable:
            log.exception("records_bulk_action_not_audited", actor=actor, **result)
            if error is None:
                raise

    def _cancel_page(
        self, page: list[RecordKey], counts: BulkCounts, *, epoch: str | None, now: datetime
    ) -> None:
        with self.journal.transaction("cancel") as conn:
            done = operator_actions.cancel(conn, [k.id for k in page], epoch=epoch, now=now)
        counts.acted += len(done)
        counts.skipped_in_flight += len(page) - len(done)

    def _retry_page(self, page: list[RecordKey], counts: BulkCounts, *, now: datetime) -> None:
        known = set(self.lines.names())
        by_line: dict[str, list[str]] = {}
        for key in page:
            if key.line in known:
                by_line.setdefault(key.line, []).append(key.id)
            else:
                counts.skipped_unknown_line += 1
        for name, ids in by_line.items():
            with self.journal.transaction("retry") as conn:
                ours = {r.id: r for r in operator_actions.claim_retry(conn, ids, now=now)}
            claimed = [ours[rid] for rid in ids if rid in ours]  # oldest first, as the page goes
            counts.acted += len(claimed)
            counts.skipped_in_flight += len(ids) - len(claimed)
            enqueued, deferred = self._push(self.lines.get(name), claimed, now=now)
            counts.enqueued += enqueued
            counts.deferred += deferred

    def _push(self, line: Line, claimed: list[Record], *, now: datetime) -> tuple[int, int]:
        """Push records claimed for a retry (`enqueued`, no epoch) onto their line's queue
        within its bound; what does not fit, or everything when Redis is down or the line
        paused, waits `deferred` for the sweeper. Returns how many were pushed and
        deferred."""
        if not claimed:
            return 0, 0
        ids = [r.id for r in claimed]
        if self.paused is not None and self.paused.is_paused(line.name):
            with self.journal.transaction("retry") as conn:
                store.move(conn, ids, Event.NOT_PUSHED, now=now)
            return 0, len(ids)
        try:
            outcome = self.pusher.push(
                line.queue,
                ids,
                business_nos=[r.business_no for r in claimed],
                senders=[r.sender for r in claimed],
                fair_share=line.settings.fair_share,
                sender_max=line.sender_max,
                max_length=line.settings.max_queue_length,
                batch_size=line.batch_size,
                keeps_left=True,
            )
        except BrokerUnavailable as exc:
            log.warning("retry_push_failed", line=line.name, error=str(exc))
            with self.journal.transaction("retry") as conn:
                store.move(conn, ids, Event.NOT_PUSHED, now=now)
            return 0, len(ids)
        pushed, left = outcome.split(ids)
        try:
            with self.journal.transaction("retry") as conn:
                claims.set_epoch(conn, pushed, epoch=outcome.epoch)
                store.move(conn, left, Event.NOT_PUSHED, now=now)
        finally:
            self.pusher.waiting.left_kept(line.queue, outcome.leaving)
        return len(pushed), len(left)

    def _epoch(self) -> str | None:
        """The current epoch; None when Redis is down (every `enqueued` record then counts
        as in flight: where its message is cannot be told)."""
        try:
            return self.pusher.epoch()
        except BrokerUnavailable:
            return None


def _found(record: Record | None, record_id: str) -> Record:
    if record is None:
        raise RecordNotFound(f"no record {record_id!r}")
    return record


def _refusal(record: Record, event: Event) -> RecordStatusConflict | RecordInFlight:
    """Why `event` did not move `record`: its status, or (a status it takes) in flight."""
    if record.status not in operator_actions.takes(event):
        takes = ", ".join(sorted(s.value for s in operator_actions.takes(event)))
        return RecordStatusConflict(
            f"record {record.id} is {record.status.value}; {_ACTION[event].value} takes {takes}",
            status=record.status.value,
        )
    return RecordInFlight(
        f"record {record.id} is in flight: an attempt holds it or its message is on its queue",
        status=record.status.value,
    )


def _write_audit(
    conn: Connection, event: Event, record: Record, *, actor: str, reason: str | None, now: datetime
) -> None:
    to = "enqueued" if event is Event.RETRIED else "cancelled"
    audit.write(
        conn,
        actor=actor,
        action=_ACTION[event],
        target=f"record:{record.id}",
        params={"line": record.line, "business_no": record.business_no},
        result={"from": record.status.value, "to": to},
        reason=reason,
        now=now,
    )
