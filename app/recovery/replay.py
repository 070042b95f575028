"""Replay: put journal records back on their queues, by line, time range,
business numbers and statuses, skipping those already `done` and those downstream already
has. Streams through the journal in keyset pages (flat memory), respects each line's bound
(what does not fit is `deferred` for the sweeper). Each run is kept in the `replays` table;
a real run also writes an audit row, in the transaction that finishes it, and raises
`REPLAY_FINISHED`. A dry run only counts: it is not an action, so it is neither audited nor
alerted.

`rejected` records are replayed only when asked for by status: their caller was answered
429 and may have sent them again, as a new record."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime

import httpx
from sqlalchemy import Connection

from app.admission.push import Pusher
from app.errors import JournalUnavailable
from app.ids import new_id
from app.journal import audit, claims, store
from app.journal.journal import Journal
from app.journal.models import UNFINISHED, RecordStatus
from app.journal.store import RecordFilter, RecordKey
from app.journal.transitions import Event as TransitionEvent
from app.lines import Line, LineRegistry
from app.recovery.downstream import downstream_has
from app.recovery.pipelined import pipelined
from app.telemetry.alerts import Alerter
from app.telemetry.events import Event
from app.telemetry.logs import get_logger

log = get_logger(__name__)

PAGE_SIZE = 1000
# Pages claimed at once on PostgreSQL, each in its own transaction and connection, while
# the page before them is pushed (see `Replayer._claims_ahead`); the journal's pool
# holds 5 connections, and a replay also reads.
CLAIMS_AHEAD = 2
# Where a replayed record ends up: done (downstream has it), enqueued, deferred (full).
_REPLAY_MOVES_TO = (RecordStatus.DONE, RecordStatus.ENQUEUED, RecordStatus.DEFERRED)
# By default replay takes everything that is neither done nor rejected.
DEFAULT_STATUSES = (*UNFINISHED, RecordStatus.DEAD)


@dataclass(frozen=True, kw_only=True)
class ReplayFilter:
    """Which records to replay."""

    line: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    business_nos: Sequence[str] = ()
    statuses: Sequence[RecordStatus] = DEFAULT_STATUSES

    def record_filter(self) -> RecordFilter:
        return RecordFilter(
            line=self.line,
            statuses=self.statuses,
            business_nos=self.business_nos,
            since=self.since,
            until=self.until,
        )

    def describe(self) -> dict[str, object]:
        return {
            "line": self.line,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "business_nos": list(self.business_nos),
            "statuses": [s.value for s in self.statuses],
        }


@dataclass(kw_only=True)
class ReplayCounts:
    """What a replay found and did (in a dry run: what it would do)."""

    matched: int = 0
    enqueued: int = 0
    deferred: int = 0
    skipped_done: int = 0
    skipped_synced: int = 0
    skipped_in_flight: int = 0
    by_line: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class _Batch:
    """One line's part of a page: `todo` records downstream lacks (`synced` it has), of
    which this replay claimed `ours` in `epoch` at `now` (a dry run claims nothing: `ours`
    are the `todo`)."""

    line: Line
    synced: int
    todo: int
    ours: list[RecordKey]
    epoch: str
    now: datetime


@dataclass(frozen=True, kw_only=True)
class _Page:
    """A page claimed, to be pushed and counted."""

    size: int
    batches: list[_Batch]


@dataclass(frozen=True, kw_only=True)
class Replayer:
    """Puts journal records back on their queues (`replay`), skipping what downstream has."""

    journal: Journal
    pusher: Pusher
    lines: LineRegistry
    http: httpx.Client
    alerts: Alerter

    def count_matching(self, where: ReplayFilter) -> int:
        """How many records `where` selects (for a progress bar)."""
        with self.journal.reading() as conn:
            return store.count_records(conn, where.record_filter())

    def replay(
        self,
        where: ReplayFilter,
        *,
        dry_run: bool,
        actor: str,
        clock: Callable[[], datetime],
        on_page: Callable[[int], None] | None = None,
        reason: str | None = None,
    ) -> ReplayCounts:
        """Replay the records `where` selects, as `actor` (the audit log's name for who
        asked). Raises `JournalUnavailable`, `BrokerUnavailable`; a real run that fails
        part-way is still audited, with what it had done and the error's name."""
        counts = ReplayCounts()
        replay_id = new_id(clock())
        with self.journal.transaction("replay") as conn:
            store.start_replay(
                conn,
                replay_id=replay_id,
                actor=actor,
                where=where.describe(),
                dry_run=dry_run,
                now=clock(),
            )
        try:
            self._replay_all(where, counts, dry_run=dry_run, clock=clock, on_page=on_page)
        except BaseException as exc:  # Ctrl-C too: what the pages done did is done
            if not dry_run:
                self._audit_failed(where, counts, actor=actor, reason=reason, exc=exc, now=clock())
            raise
        with self.journal.transaction("replay") as conn:
            store.finish_replay(conn, replay_id=replay_id, counts=asdict(counts), now=clock())
            if not dry_run:
                self._audit(conn, where, counts, actor=actor, reason=reason, now=clock())
        log.info("replay_finished", replay_id=replay_id, dry_run=dry_run, **asdict(counts))
        if not dry_run:
            self._alert(where, counts, actor=actor, replay_id=replay_id)
        return counts

    def _replay_all(
        self,
        where: ReplayFilter,
        counts: ReplayCounts,
        *,
        dry_run: bool,
        clock: Callable[[], datetime],
        on_page: Callable[[int], None] | None,
    ) -> None:
        # One (line, status) at a time: each page is then a range of the (line, status, id)
        # index, however large the journal, instead of a sort of every match. The statuses
        # a replay moves records to come first, so no record is met twice.
        lines = [where.line] if where.line else self.lines.names()
        statuses = sorted(where.statuses, key=lambda s: s not in _REPLAY_MOVES_TO)

        def pages() -> Iterator[list[RecordKey]]:
            for line_name, status in itertools.product(lines, statuses):
                part = replace(where.record_filter(), line=line_name, statuses=[status])
                cursor: str | None = None
                while True:
                    with self.journal.reading() as conn:
                        page = store.list_record_keys(conn, part, limit=PAGE_SIZE, after=cursor)
                    if not page:
                        break
                    cursor = page[-1].id
                    # Counted as read: a run that fails later still says what it found.
                    counts.matched += len(page)
                    counts.skipped_done += sum(r.status is RecordStatus.DONE for r in page)
                    yield page

        def push(page: _Page) -> None:
            self._push_page(page, counts, dry_run=dry_run)
            if on_page:
                on_page(page.size)

        # Pages read ahead (a page read before the one before it is pushed) meet no record
        # twice: a page's keyset starts past the ids already read, and the records a replay
        # moves go to statuses read before the others.
        pipelined(
            pages(),
            lambda page: self._claim_page(page, dry_run=dry_run, clock=clock),
            push,
            ahead=self._claims_ahead(),
        )

    def _claims_ahead(self) -> int:
        """How many pages are claimed at once while the page before them is pushed. On
        PostgreSQL a claim's time is its index writes (nine indexes for every row moved),
        done by its own server process: two at once use both cores of a small host, and
        the pushes run meanwhile. SQLite takes one writer at a time: its claims run in
        turn, on this thread."""
        return CLAIMS_AHEAD if self.journal.engine.dialect.name == "postgresql" else 0

    def _audit(
        self,
        conn: Connection,
        where: ReplayFilter,
        counts: ReplayCounts,
        *,
        actor: str,
        reason: str | None,
        now: datetime,
        error: str | None = None,
    ) -> None:
        result: dict[str, object] = asdict(counts)
        if error is not None:
            result["error"] = error
        audit.write(
            conn,
            actor=actor,
            action=audit.Action.REPLAY,
            target=f"line:{where.line or '*'}",
            params=where.describe(),
            result=result,
            reason=reason,
            now=now,
        )

    def _audit_failed(
        self,
        where: ReplayFilter,
        counts: ReplayCounts,
        *,
        actor: str,
        reason: str | None,
        exc: BaseException,
        now: datetime,
    ) -> None:
        """Audit a run that failed part-way: what it did before the failure is done. The
        failure itself is raised on; a journal that cannot take the row only logs."""
        try:
            with self.journal.transaction("replay") as conn:
                self._audit(
                    conn,
                    where,
                    counts,
                    actor=actor,
                    reason=reason,
                    now=now,
                    error=type(exc).__name__,
                )
        except JournalUnavailable:
            log.warning("replay_not_audited", actor=actor, **asdict(counts))

    def _alert(
        self, where: ReplayFilter, counts: ReplayCounts, *, actor: str, replay_id: str
    ) -> None:
        skipped = counts.skipped_done + counts.skipped_synced + counts.skipped_in_flight
        self.alerts.raise_event(
            Event.REPLAY_FINISHED,
            line=where.line,
            message=f"replay by {actor}: {counts.matched} matched, {counts.enqueued} enqueued, "
            f"{counts.deferred} deferred, {skipped} skipped",
            replay_id=replay_id,
            dry_run=False,
            matched=counts.matched,
            enqueued=counts.enqueued,
            deferred=counts.deferred,
            skipped_done=counts.skipped_done,
            skipped_synced=counts.skipped_synced,
            skipped_in_flight=counts.skipped_in_flight,
        )

    def _claim_page(
        self, page: list[RecordKey], *, dry_run: bool, clock: Callable[[], datetime]
    ) -> _Page:
        """Ask downstream about `page`, mark what it has `done` and claim the rest (in a
        dry run: only ask). Runs on a pipeline thread: it touches no counts."""
        batches: list[_Batch] = []
        by_line: dict[str, list[RecordKey]] = {}
        for record in page:
            if record.status is not RecordStatus.DONE:
                by_line.setdefault(record.line, []).append(record)
        for line_name, batch in by_line.items():
            line = self.lines.get(line_name)
            synced = downstream_has(self.journal, self.http, line, batch)
            todo = [r for r in batch if r.id not in synced]
            now = clock()
            if dry_run:
                batches.append(
                    _Batch(
                        line=line, synced=len(synced), todo=len(todo), ours=todo, epoch="", now=now
                    )
                )
                continue
            # Claimed in the epoch they are about to be pushed in: one transaction per page
            # unless the queue fills up or Redis restarts in between. Only what this replay
            # claimed is pushed: a record in flight (a live lease, or enqueued in this epoch),
            # or one another replay claimed first, is left alone.
            epoch = self.pusher.epoch()
            with self.journal.transaction() as conn:
                store.mark_synced(conn, sorted(synced), now=now)
                claimed = set(
                    claims.claim_as_enqueued(
                        conn,
                        todo,
                        TransitionEvent.REPLAYED,
                        now=now,
                        fresh_attempts=True,
                        epoch=epoch,
                        not_in_epoch=epoch,
                    )
                )
            ours = [r for r in todo if r.id in claimed]
            batches.append(
                _Batch(
                    line=line, synced=len(synced), todo=len(todo), ours=ours, epoch=epoch, now=now
                )
            )
        return _Page(size=len(page), batches=batches)

    def _push_page(self, page: _Page, counts: ReplayCounts, *, dry_run: bool) -> None:
        """Push what `_claim_page` claimed, oldest first, within each line's bound: what
        does not fit goes `deferred`. Counts what the page's records became."""
        for batch in page.batches:
            line, ours, epoch = batch.line, batch.ours, batch.epoch
            counts.skipped_synced += batch.synced
            if dry_run:
                counts.enqueued += batch.todo
                continue
            counts.skipped_in_flight += batch.todo - len(ours)
            outcome = self.pusher.push(
                line.queue,
                [r.id for r in ours],
                business_nos=[r.business_no for r in ours],
                senders=[r.sender for r in ours],
                fair_share=line.settings.fair_share,
                sender_max=line.sender_max,
                max_length=line.settings.max_queue_length,
                batch_size=line.batch_size,
                keeps_left=True,
            )
            pushed, left = outcome.split([r.id for r in ours])
            if left or outcome.epoch != epoch:
                try:
                    with self.journal.transaction() as conn:
                        if outcome.epoch != epoch:
                            claims.set_epoch(conn, pushed, epoch=outcome.epoch, replace=True)
                        store.move(conn, left, TransitionEvent.NOT_PUSHED, now=batch.now)
                finally:
                    self.pusher.waiting.left_kept(line.queue, outcome.leaving)
            counts.enqueued += len(pushed)
            counts.deferred += len(left)
            counts.by_line[line.name] = counts.by_line.get(line.name, 0) + len(ours)
