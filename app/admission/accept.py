"""Accepting a unit of work: journal it first, then admit it onto its line's queue.

The one path for intake requests and scheduled fires: the journal row is committed before
anything is pushed, so a 2xx always means the record is durable. The intake runs the two
steps on two threads (`accept_group`, then `PushStage`), so that its answer never waits on
Redis: a committed record whose push has not finished within the answer's wait is answered
`received`, and the sweeper pushes it if the push does not."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from app.admission.pause import PausedLines
from app.admission.push import Pusher
from app.errors import BrokerUnavailable, JournalInDoubt, JournalUnavailable, ShuttingDown
from app.journal import store
from app.journal.commits import CommitGate, CommitQueue
from app.journal.journal import Journal
from app.journal.models import Record, RecordStatus
from app.journal.store import NewRecord
from app.journal.transitions import Event as TransitionEvent
from app.line_settings import Overflow
from app.lines import Line, LineRegistry
from app.logs import get_logger
from app.observe.alerts import Alerter
from app.observe.events import Event

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
    the dedup keys of the intake's requests they came from (`PushStage.marked`)."""

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
            log.debug(
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
        on_queue, overflow = admitted[: pushed.pushed], admitted[pushed.pushed :]
        enqueued.setdefault(pushed.epoch, []).extend(r.id for r in on_queue)
        outcomes = [
            Acceptance(record=r, status=RecordStatus.ENQUEUED, created=True) for r in on_queue
        ]
        decision = decide_overflow(policy)
        # New records deferred only to keep them behind older ones raise no alert: the
        # queue has room, and the line is catching up.
        catching_up = pushed.behind and pushed.depth < line.settings.max_queue_length
        if not catching_up:
            self._alert_overflow(line, len(overflow), depth=pushed.depth, policy=policy)
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

    def _alert_overflow(self, line: Line, count: int, *, depth: int, policy: Overflow) -> None:
        """`QUEUE_FULL` (and `CALLER_RUNS` under that policy) for each of `count` records
        that did not fit on `line`'s queue."""
        for _ in range(count):
            self.alerts.raise_event(
                Event.QUEUE_FULL,
                line=line.name,
                message=f"queue {line.queue!r} is full ({depth}/"
                f"{line.settings.max_queue_length}); policy {policy.value}",
                depth=depth,
                limit=line.settings.max_queue_length,
                policy=policy.value,
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


class Admission:
    """One request's committed record on its way onto its queue (`PushStage`), and the
    request's wait for that: its answer comes from the push, or says `received` once the
    wait is over (the caller then stopped waiting, and its record is never refused)."""

    WAITING, DECIDED, LEFT = range(3)

    # Set once committed (`committed`).
    record: Record
    created: bool
    committed_at_s: float

    def __init__(self, new: NewRecord) -> None:
        """Made by the request, on its event loop: its answer is settled there."""
        self.new = new
        self.loop = asyncio.get_running_loop()
        self.outcome: asyncio.Future[Acceptance] = self.loop.create_future()
        # The admission of the request that created this one's record in the same group
        # (two requests with one nonce, committed together): its status is this one's.
        self.follows: Admission | None = None
        self._lock = threading.Lock()
        self._state = self.WAITING

    def committed(self, record: Record, *, created: bool) -> None:
        """Its record is in the journal (made by this request's write, or known)."""
        self.record = record
        self.created = created
        self.committed_at_s = time.monotonic()

    @property
    def needs_push(self) -> bool:
        """Created now, or a rejected record sent again: not only a known dedup key."""
        return self.created or is_resent(self.record, self.new)

    def decide(self) -> bool:
        """The push's side: whether the caller still waits for its overflow decision (and
        now gets it, however long its journal move takes)."""
        with self._lock:
            if self._state == self.WAITING:
                self._state = self.DECIDED
            return self._state == self.DECIDED

    def _leave(self) -> bool:
        with self._lock:
            if self._state == self.WAITING:
                self._state = self.LEFT
            return self._state == self.LEFT

    async def acceptance(self, *, wait_s: float, journal_wait_s: float) -> Acceptance:
        """The record's admission, or `received` once `wait_s` has passed without it (an
        overflow decision already made is waited for: its journal move, `journal_wait_s`).
        Raises `JournalInDoubt` when that move gives no outcome in time."""
        if not self.needs_push:
            status = self.record.status
            if self.follows is not None:
                followed = asyncio.shield(self.follows.outcome)
                try:
                    status = (await asyncio.wait_for(followed, wait_s)).status
                except TimeoutError:
                    status = RecordStatus.RECEIVED
            return Acceptance(record=self.record, status=status, created=False)
        future = self.outcome
        done, _ = await asyncio.wait((future,), timeout=wait_s)  # the future stays uncancelled
        if done:
            return future.result()
        if self._leave():
            return Acceptance(record=self.record, status=RecordStatus.RECEIVED, created=True)
        try:
            return await asyncio.wait_for(future, journal_wait_s)
        except TimeoutError:
            raise JournalInDoubt("the record's overflow move gave no outcome in time") from None


# The most records one push of the intake takes.
MAX_PUSH_GROUP = 256


class PushStage:
    """The intake's pushes, on a thread of their own: the committed records of the requests
    waiting together, pushed by `Acceptor.admit_many` (one push per line). A record that
    waited here longer than `stale_after_s` (Redis did not answer the pushes before it) is
    left `received` for the sweeper, whose grace period is twice that."""

    def __init__(
        self,
        acceptor: Acceptor,
        *,
        clock: Callable[[], datetime],
        stale_after_s: float,
        mark: Callable[[Enqueued], None],
    ) -> None:
        self._acceptor = acceptor
        self._clock = clock
        self._stale_after_s = stale_after_s
        # Hands the records pushed to the journal's writer (`intake_pipeline`): one writer
        # per process, so the marking never waits for the journal's lock beside it.
        self._mark = mark
        self._queue: queue.SimpleQueue[Admission | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        # The admissions submitted and not yet through (marked `enqueued` included), by
        # dedup key: a request with a known nonce follows its record's admission.
        self._by_key: dict[str, Admission] = {}

    def in_flight(self, dedup_key: str) -> Admission | None:
        """The admission of the record with `dedup_key`, while it is on its way."""
        return self._by_key.get(dedup_key)

    def submit(self, admissions: Sequence[Admission]) -> None:
        """Push these records, with those waiting, as soon as the thread is free."""
        if not admissions:
            return
        with self._lock:
            if self._closed:
                _answer([(a, ShuttingDown("the intake is stopping")) for a in admissions])
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="intake-push", daemon=True)
                self._thread.start()
            for admission in admissions:
                self._by_key[admission.new.dedup_key] = admission
        for admission in admissions:
            self._queue.put(admission)

    def _take(self, first: Admission) -> list[Admission]:
        taken = [first]
        while len(taken) < MAX_PUSH_GROUP:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # stop after this group
                break
            taken.append(item)
        return taken

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            taken = self._take(first)
            now_s = time.monotonic()
            stale = [a for a in taken if now_s - a.committed_at_s > self._stale_after_s]
            _answer([(admission, _received(admission)) for admission in stale])
            group = [a for a in taken if now_s - a.committed_at_s <= self._stale_after_s]
            handed = self._push(group) if group else False
            # Those handed for marking stay on their way until it is written (`marked`).
            self._forget([a.new.dedup_key for a in (stale if handed else taken)])

    def marked(self, marks: Sequence[Enqueued]) -> None:
        """The writes marked these records `enqueued` (or gave up): no longer on their way."""
        self._forget([key for m in marks for key in m.dedup_keys])

    def _forget(self, dedup_keys: Sequence[str]) -> None:
        with self._lock:
            for key in dedup_keys:
                self._by_key.pop(key, None)

    def _push(self, group: list[Admission]) -> bool:
        """Push `group`; whether its records were handed to the writes for marking."""
        by_id = {a.record.id: a for a in group}
        answered = False
        handed = False

        def mark(enqueued: Enqueued) -> None:
            nonlocal handed
            keys = tuple(a.new.dedup_key for a in group)
            self._mark(replace(enqueued, dedup_keys=keys))
            handed = True

        def answer(outcomes: list[Acceptance]) -> None:
            nonlocal answered
            _answer(list(zip(group, outcomes, strict=True)))
            answered = True

        try:
            self._acceptor.admit_many(
                [a.new for a in group],
                [(a.record, a.created) for a in group],
                clock=self._clock,
                answering=lambda record_id: by_id[record_id].decide(),
                on_admitted=answer,
                mark=mark,
            )
        except Exception:
            log.exception("intake_push_failed", count=len(group))
        if not answered:  # the records are committed: `received`, for the sweeper
            _answer([(admission, _received(admission)) for admission in group])
        return handed

    def close(self, *, timeout_s: float = 10.0) -> None:
        """Push what was submitted, then stop the thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=timeout_s)


def _received(admission: Admission) -> Acceptance:
    return Acceptance(record=admission.record, status=RecordStatus.RECEIVED, created=True)


def _answer(admissions: Sequence[tuple[Admission, Acceptance | BaseException]]) -> None:
    """Settle each admission's outcome on its request's event loop: one wake-up per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Admission, object]]] = {}
    for admission, outcome in admissions:
        by_loop.setdefault(admission.loop, []).append((admission, outcome))
    for loop, settled in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle_all, settled)
        except RuntimeError:  # the event loop is gone: its process is stopping
            log.warning("intake_answer_lost", count=len(settled))


def _settle_all(settled: list[tuple[Admission, object]]) -> None:
    for admission, outcome in settled:
        if admission.outcome.done():
            continue
        if isinstance(outcome, BaseException):
            admission.outcome.set_exception(outcome)
        else:
            admission.outcome.set_result(outcome)  # type: ignore[arg-type]


def intake_pipeline(
    acceptor: Acceptor, *, clock: Callable[[], datetime], timeout_s: float, stale_after_s: float
) -> tuple[CommitQueue[Admission | Enqueued, Admission | None], PushStage]:
    """The intake's two steps. Its journal writes: the records of concurrent requests
    committed together (`Acceptor.journal_many`, one transaction, with the records pushed
    since marked `enqueued` in it); each request's `Admission` is answered once its record
    is committed. Then its pushes (`PushStage`), which hand what they pushed back to the
    writes for marking."""

    def write(
        items: list[Admission | Enqueued],
        answer: Callable[[Sequence[Admission | None]], None],
        gate: CommitGate,
    ) -> None:
        admissions = [item for item in items if isinstance(item, Admission)]
        marks = [item for item in items if isinstance(item, Enqueued)]
        news = [a.new for a in admissions]
        # Read before the rows: an admission no longer on its way has marked its record.
        on_its_way = [pushes.in_flight(new.dedup_key) for new in news]
        try:
            stored = acceptor.journal_many(news, clock=clock, gate=gate, enqueued=marks)
        except JournalUnavailable:
            if marks:  # they stay `received`: the sweeper pushes them again, harmlessly
                log.warning("records_status_not_saved", count=_count_marked(marks))
            raise
        finally:
            pushes.marked(marks)
        for admission, (record, created) in zip(admissions, stored, strict=True):
            admission.committed(record, created=created)
        created_now = {a.record.id: a for a in admissions if a.created}
        for admission, earlier in zip(admissions, on_its_way, strict=True):
            if admission.created:
                continue
            if earlier is not None and earlier.record.id == admission.record.id:
                admission.follows = earlier
            else:
                admission.follows = created_now.get(admission.record.id)
        answer([item if isinstance(item, Admission) else None for item in items])
        pushes.submit([a for a in admissions if a.needs_push])

    writes: CommitQueue[Admission | Enqueued, Admission | None] = CommitQueue(
        write, name="group-accept", timeout_s=timeout_s
    )
    pushes = PushStage(acceptor, clock=clock, stale_after_s=stale_after_s, mark=writes.put_nowait)
    return writes, pushes


def _count_marked(marks: Sequence[Enqueued]) -> int:
    return sum(len(ids) for m in marks for ids in m.by_epoch.values())
