"""The intake's path for a record: its request's record committed with those of the
requests waiting beside it, then pushed by a thread of its own, so that the answer never
waits on Redis: a committed record whose push has not finished within the request's wait is
answered `received`, and the sweeper pushes it if the push does not.

One journal writer per process (`intake_pipeline`'s commit queue) writes the records and,
in the same transactions, the marking of those the push thread pushed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from app.admission.accept import Acceptance, Acceptor, Enqueued, is_resent
from app.errors import JournalInDoubt, JournalUnavailable
from app.journal.commits import CommitGate, CommitQueue
from app.journal.models import Record, RecordStatus
from app.journal.store import NewRecord
from app.telemetry.logs import get_logger

log = get_logger(__name__)


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
        # The pushes' thread: the commit queues' writer, taking every admission waiting
        # as one group (nobody awaits its answer: each admission is answered itself).
        self._groups: CommitQueue[Admission, None] = CommitQueue(
            self._write, name="intake-push", timeout_s=stale_after_s, max_group=MAX_PUSH_GROUP
        )
        self._lock = threading.Lock()
        # The admissions submitted and not yet through (marked `enqueued` included), by
        # dedup key: a request with a known nonce follows its record's admission.
        self._by_key: dict[str, Admission] = {}

    def in_flight(self, dedup_key: str) -> Admission | None:
        """The admission of the record with `dedup_key`, while it is on its way."""
        return self._by_key.get(dedup_key)

    def submit(self, admissions: Sequence[Admission]) -> None:
        """Push these records, with those waiting, as soon as the thread is free (once the
        intake is stopping, never: they are `received`, for the sweeper)."""
        with self._lock:
            for admission in admissions:
                self._by_key[admission.new.dedup_key] = admission
        for admission in admissions:
            self._groups.put_nowait(admission)

    def _write(
        self, taken: list[Admission], answer: Callable[[Sequence[None]], None], _gate: CommitGate
    ) -> None:
        now_s = time.monotonic()
        stale = [a for a in taken if now_s - a.committed_at_s > self._stale_after_s]
        _answer([(admission, _received(admission)) for admission in stale])
        group = [a for a in taken if now_s - a.committed_at_s <= self._stale_after_s]
        handed = self._push(group) if group else False
        # Those handed for marking stay on their way until it is written (`marked`).
        self._forget([a.new.dedup_key for a in (stale if handed else taken)])
        answer([None] * len(taken))

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
        self._groups.close(timeout_s=timeout_s)


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
