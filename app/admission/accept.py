"""Accepting a unit of work: journal it first, then admit it onto its line's queue.

The one path for intake requests and scheduled fires: the journal row is committed before
anything is pushed, so a 2xx always means the record is durable. The intake runs the two
steps on two threads of its own (`app.admission.intake_path`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from app.admission.pause import PausedLines
from app.admission.push import Pusher
from app.config.line_settings import Overflow
from app.errors import BrokerUnavailable, JournalUnavailable
from app.journal import store
from app.journal.commits import CommitGate
from app.journal.journal import Journal
from app.journal.models import Record, RecordStatus
from app.journal.store import NewRecord
from app.journal.transitions import Event as TransitionEvent
from app.lines import Line, LineRegistry
from app.telemetry.alerts import Alerter
from app.telemetry.events import Event
from app.telemetry.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class Acceptance:
    """The stored record, its status after admission, and whether this call created it.

    `caller_runs` means the queue was full under that policy: the caller must now run the
    record itself (the attempt engine, `app.delivery.engine`) before it answers."""

    record: Record
    status: RecordStatus
    created: bool
    caller_runs: bool = False


@dataclass(frozen=True, kw_only=True)
class OverflowDecision:
    """What becomes of a record that found its queue full: the status it is answered
    with, the journal move that records it (None: the caller runs it, nothing is moved)."""

    status: RecordStatus
    transition: TransitionEvent | None

    @property
    def caller_runs(self) -> bool:
        return self.transition is None


@dataclass(frozen=True, kw_only=True)
class Enqueued:
    """Records pushed, to be marked `enqueued`: their ids by the epoch of their push, and
    the dedup keys of the intake's requests they came from (`PushStage.marked`, in
    `app.admission.intake_path`)."""

    by_epoch: dict[str, list[str]]
    dedup_keys: tuple[str, ...] = ()


def decide_overflow(policy: Overflow) -> OverflowDecision:
    """The overflow policy's decision for one record that did not fit on its queue."""
    if policy is Overflow.CALLER_RUNS:
        return OverflowDecision(status=RecordStatus.RECEIVED, transition=None)
    if policy is Overflow.REJECT:
        return OverflowDecision(status=RecordStatus.REJECTED, transition=TransitionEvent.REJECTED)
    return OverflowDecision(status=RecordStatus.DEFERRED, transition=TransitionEvent.DEFERRED)


@dataclass(frozen=True, kw_only=True)
class Acceptor:
    """Takes in units of work: journals them, then pushes them onto their lines' queues."""

    journal: Journal
    pusher: Pusher
    alerts: Alerter
    lines: LineRegistry
    # Told the name of a line whose new records were deferred behind older ones while its
    # queue had room: something should push the older ones now (the intake's drain).
    on_room_behind: Callable[[str], None] | None = None
    # The paused lines: their new records wait in the journal, pushed after the resume.
    paused: PausedLines | None = None

    def accept(
        self,
        new: NewRecord,
        *,
        clock: Callable[[], datetime],
        overflow: Overflow | None = None,
    ) -> Acceptance:
        """Journal `new` (unless its dedup key is known) and push it onto its queue.

        `overflow` replaces the line's policy for a full queue (a scheduled fire defers: no
        caller is there to send it again, or to run it).

        Raises `JournalUnavailable` if the record could not be committed; a Redis failure
        leaves the record `received` for the sweeper and is not an error."""
        return self.accept_many([new], clock=clock, overflow=overflow)[0]

    def accept_many(
        self,
        news: Sequence[NewRecord],
        *,
        clock: Callable[[], datetime],
        overflow: Overflow | None = None,
    ) -> list[Acceptance]:
        """`accept` for several records at once: `journal_many`, then `admit_many`.

        Raises `JournalUnavailable` (for all of them) if the rows could not be committed."""
        stored = self.journal_many(news, clock=clock)
        return self.admit_many(news, stored, clock=clock, overflow=overflow)

    def journal_many(
        self,
        news: Sequence[NewRecord],
        *,
        clock: Callable[[], datetime],
        gate: CommitGate | None = None,
        enqueued: Sequence[Enqueued] = (),
    ) -> list[tuple[Record, bool]]:
        """Commit the rows of `news` (`received`) in one transaction, but for the dedup keys
        already known; each stored record, in order, and whether this call created it.
        `enqueued`: records pushed since, marked `enqueued` in the same transaction. `gate`
        is passed just before the commit (`app.journal.commits`).

        Raises `JournalUnavailable` (for all of them) if the rows could not be committed."""
        with self.journal.transaction("journal write") as conn:
            now = clock()
            stored = store.insert_records(conn, news, now=now) if news else []
            for marks in enqueued:
                for epoch, ids in marks.by_epoch.items():
                    store.mark_enqueued(conn, ids, epoch=epoch, now=now)
            if gate is not None:
                gate()
        return stored

    def admit_many(
        self,
        news: Sequence[NewRecord],
        stored: Sequence[tuple[Record, bool]],
        *,
        clock: Callable[[], datetime],
        overflow: Overflow | None = None,
        answering: Callable[[str], bool] | None = None,
        on_admitted: Callable[[list[Acceptance]], None] | None = None,
        mark: Callable[[Enqueued], None] | None = None,
    ) -> list[Acceptance]:
        """Push the committed records `stored` (of `news`, in order) onto their queues: each
        line's in one push, in order while room remains; then mark those pushed `enqueued`
        in one transaction. A known dedup key is answered as its record is, unless it is a
        rejected record sent again, which is admitted again.

        `overflow`, when given, is the policy for a full queue instead of each line's own.
        `answering(record_id)` says whether the record's caller still waits for its overflow
        decision (None: every caller does); one that stopped waiting was answered `received`,
        so its record is deferred, whatever the policy. `on_admitted` gets the outcomes as
        soon as they are known, before the marking: that is bookkeeping that loses nothing
        when it fails (a record pushed but still `received` is only pushed again). `mark`,
        when given, takes the marking over (the intake writes it with its next group)."""
        results: list[Acceptance | None] = [None] * len(news)
        admit: dict[str, list[int]] = {}
        for i, (new, (record, created)) in enumerate(zip(news, stored, strict=True)):
            if not created and not (is_resent(record, new) and self._resend(record, clock)):
                results[i] = Acceptance(record=record, status=record.status, created=False)
                continue
            admit.setdefault(record.line, []).append(i)
        enqueued: dict[str, list[str]] = {}
        # The line with the fewest records of the group is pushed first: a flood on one line
        # does not hold back the push of another line's records committed beside it.
        for line_name, indexes in sorted(admit.items(), key=lambda item: len(item[1])):
            line = self.lines.get(line_name)
            admitted = [stored[i][0] for i in indexes]
            log.info(
                "records_received",
                line=line_name,
                count=len(admitted),
                first_id=admitted[0].id,
                last_id=admitted[-1].id,
            )
            policy = overflow if overflow is not None else line.settings.overflow
            admitted_outcomes = self._admit(
                line,
                admitted,
                enqueued=enqueued,
                clock=clock,
                policy=policy,
                answering=answering or _always,
            )
            for i, outcome in zip(indexes, admitted_outcomes, strict=True):
                results[i] = outcome
        outcomes = _as_admitted([result for result in results if result is not None])
        if on_admitted is not None:
            on_admitted(outcomes)
        if mark is not None:
            if any(enqueued.values()):
                mark(Enqueued(by_epoch=enqueued))
        else:
            self._mark_enqueued(enqueued, clock)
        return outcomes

    def _admit(
        self,
        line: Line,
        admitted: list[Record],
        *,
        enqueued: dict[str, list[str]],
        clock: Callable[[], datetime],
        policy: Overflow,
        answering: Callable[[str], bool],
    ) -> list[Acceptance]:
        """Push `admitted` onto `line`'s queue; the overflow follows `policy` (see
        `admit_many` for `answering`). Adds the ids pushed to `enqueued` under their
        epoch."""
        if self.paused is not None and self.paused.is_paused(line.name):
            return self._hold(admitted, clock)
        defers = policy is Overflow.DEFER
        try:
            pushed = self.pusher.push(
                line.queue,
                [r.id for r in admitted],
                business_nos=[r.business_no for r in admitted],
                traceparents=[r.traceparent for r in admitted],
                senders=[r.sender for r in admitted],
                fair_share=line.settings.fair_share,
                sender_max=line.sender_max,
                max_length=line.settings.max_queue_length,
                batch_size=line.batch_size,
                behind=defers,
                keeps_left=defers,
            )
        except BrokerUnavailable as exc:
            log.warning("broker_down_records_kept", line=line.name, error=str(exc))
            return [
                Acceptance(record=r, status=RecordStatus.RECEIVED, created=True) for r in admitted
            ]
        on_queue, overflow = pushed.split(admitted)
        enqueued.setdefault(pushed.epoch, []).extend(r.id for r in on_queue)
        outcomes = [
            Acceptance(record=r, status=RecordStatus.ENQUEUED, created=True) for r in on_queue
        ]
        decision = decide_overflow(policy)
        # New records deferred only to keep them behind older ones raise no alert: the
        # queue has room, and the line is catching up.
        catching_up = pushed.behind and pushed.depth < line.settings.max_queue_length
        if not catching_up:
            self._alert_overflow(
                line, len(overflow), depth=pushed.depth, policy=policy, senders=pushed.at_part
            )
        if decision.transition is not TransitionEvent.DEFERRED:
            # A caller that stopped waiting was told `received`: its record is kept for the
            # sweeper, not refused or left for a caller to run.
            waited = [answering(r.id) for r in overflow]
            gone = [r for r, waits in zip(overflow, waited, strict=True) if not waits]
            overflow = [r for r, waits in zip(overflow, waited, strict=True) if waits]
            if gone:
                self._move_all(gone, TransitionEvent.DEFERRED, clock)
                outcomes += [
                    Acceptance(record=r, status=RecordStatus.RECEIVED, created=True) for r in gone
                ]
        by_id = {o.record.id: o for o in outcomes}
        if decision.transition is None:
            for r in overflow:
                by_id[r.id] = Acceptance(
                    record=r, status=decision.status, created=True, caller_runs=True
                )
            return [by_id[r.id] for r in admitted]
        moved = self._move_all(overflow, decision.transition, clock)
        self.pusher.waiting.left_kept(line.queue, pushed.leaving)
        if catching_up and self.on_room_behind is not None:
            self.on_room_behind(line.name)
        # What was not recorded stays `received`: the sweeper will take it.
        status = decision.status if moved else RecordStatus.RECEIVED
        for r in overflow:
            by_id[r.id] = Acceptance(record=r, status=status, created=True)
        return [by_id[r.id] for r in admitted]

    def _hold(self, admitted: list[Record], clock: Callable[[], datetime]) -> list[Acceptance]:
        """New records of a paused line, whatever its policy: `deferred` in the journal
        (`received` if that move fails), pushed by the sweeper after the resume."""
        moved = self._move_all(admitted, TransitionEvent.DEFERRED, clock)
        status = RecordStatus.DEFERRED if moved else RecordStatus.RECEIVED
        return [Acceptance(record=r, status=status, created=True) for r in admitted]

    def _alert_overflow(
        self, line: Line, count: int, *, depth: int, policy: Overflow, senders: Sequence[str]
    ) -> None:
        """`QUEUE_FULL` (and `CALLER_RUNS` under that policy) for each of `count` records
        that did not fit on `line`'s queue, or in their sender's part of it (`senders`)."""
        bound = line.settings.max_queue_length
        if senders:
            named = ", ".join(repr(sender) for sender in senders)
            message = (
                f"queue {line.queue!r} is full for {named} ({line.sender_max} records each, "
                f"of {depth}/{bound}); policy {policy.value}"
            )
        else:
            message = f"queue {line.queue!r} is full ({depth}/{bound}); policy {policy.value}"
        extra = {"senders": ", ".join(senders), "sender_limit": line.sender_max} if senders else {}
        for _ in range(count):
            self.alerts.raise_event(
                Event.QUEUE_FULL,
                line=line.name,
                message=message,
                depth=depth,
                limit=bound,
                policy=policy.value,
                **extra,
            )
            if policy is Overflow.CALLER_RUNS:
                self.alerts.raise_event(
                    Event.CALLER_RUNS,
                    line=line.name,
                    message=f"queue {line.queue!r} is full: the intake runs the handler itself",
                )

    def _mark_enqueued(self, by_epoch: dict[str, list[str]], clock: Callable[[], datetime]) -> None:
        """`received → enqueued`; on failure the records stay `received` (see `_move`)."""
        if not any(by_epoch.values()):
            return
        try:
            with self.journal.transaction() as conn:
                for epoch, ids in by_epoch.items():
                    store.mark_enqueued(conn, ids, epoch=epoch, now=clock())
        except JournalUnavailable as exc:
            log.warning(
                "records_status_not_saved",
                count=sum(len(ids) for ids in by_epoch.values()),
                error=str(exc),
            )

    def _move_all(
        self, overflow: list[Record], event: TransitionEvent, clock: Callable[[], datetime]
    ) -> bool:
        """`event` (`received → deferred | rejected`) for every record of `overflow`, in one
        transaction."""
        if not overflow:
            return True
        try:
            with self.journal.transaction() as conn:
                store.move(conn, [r.id for r in overflow], event, now=clock())
        except JournalUnavailable as exc:
            log.warning("records_status_not_saved", transition=event.value, error=str(exc))
            return False
        return True

    def _resend(self, record: Record, clock: Callable[[], datetime]) -> bool:
        """A rejected record sent again: `rejected → received`; whether it was written. A
        failure here loses nothing: the record stays as it was."""
        event = TransitionEvent.RESENT
        try:
            with self.journal.transaction() as conn:
                moved = store.move(conn, [record.id], event, now=clock())
        except JournalUnavailable as exc:
            log.warning(
                "record_status_not_saved",
                record_id=record.id,
                transition=event.value,
                error=str(exc),
            )
            return False
        return moved == 1


def _as_admitted(outcomes: list[Acceptance]) -> list[Acceptance]:
    """A known dedup key whose record was admitted in this same group (two requests with one
    nonce, committed together) gets the status that record was admitted with, not the
    `received` its row had when it was found: every answer names the record as it is now."""
    admitted = {o.record.id: o.status for o in outcomes if o.created}
    return [
        o if o.created or o.record.id not in admitted else replace(o, status=admitted[o.record.id])
        for o in outcomes
    ]


def is_resent(record: Record, new: NewRecord) -> bool:
    """Whether `new`, whose dedup key found `record`, is a rejected request sent again as
    Retry-After asked: the same body, to the same line (a nonce sent to another line is
    refused by the caller, and moves nothing here)."""
    return (
        record.status is RecordStatus.REJECTED
        and record.body_sha256 == new.body_sha256
        and record.line == new.line
    )


def _always(_record_id: str) -> bool:
    return True
