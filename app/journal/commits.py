"""The commit queue: the journal writes of many callers, one transaction for those waiting
together. The intake's acceptances go through one
(`app.admission.intake_path.intake_pipeline`), and so do a worker's claims and outcomes
(`in_one_transaction`).

Callers put an item and await its answer; a writer thread takes everything waiting (up to
`max_group`) and writes it at once. A caller that arrives while a group is being written
joins the next group: nothing waits on a timer. A caller waits `timeout_s` for its answer.
Past it, a caller whose group has not begun to commit gives the group up: the group is
rolled back instead of committed, whenever its write comes back, so the caller's
`JournalUnavailable` is true (nothing was kept). A caller whose group is committing waits
for the commit's outcome, `timeout_s` more; past that (a commit that neither succeeds nor
fails: a connection a network blackholed) it fails with `JournalInDoubt`: what it wrote
may be kept. When every writer has been stuck on one group that long, another writer
starts (up to `MAX_WRITERS`), so the groups behind a hung connection are not held by it."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection

from app.errors import JournalInDoubt, JournalUnavailable, ShuttingDown
from app.journal.journal import Journal
from app.telemetry.logs import get_logger

log = get_logger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# The most items one group writes.
MAX_GROUP = 256
# Writer threads at most: one, and more only while every one is stuck on a journal that
# does not answer.
MAX_WRITERS = 3

Settled = Any  # an item's answer, or the exception that failed it
# Called by a group's write as the last step of its transaction, just before it commits:
# raises `GroupGivenUp` (and the transaction rolls back) when a caller gave the group up.
CommitGate = Callable[[], None]
# A group's writer: writes the items, its transaction passing the gate before it commits,
# then calls `answer` with one answer per item.
Write = Callable[[list[T], Callable[[Sequence[R]], None], CommitGate], None]
# A write of the worker's: run on the group's connection, inside its transaction.
Job = Callable[[Connection], Any]


class GroupGivenUp(Exception):
    """A caller gave its group up before the commit: roll the group back."""


class _Group:
    """One group's commit gate: its callers may give it up only until it begins to commit."""

    WRITING, COMMITTING, GIVEN_UP = range(3)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state = self.WRITING

    def pass_gate(self) -> None:
        with self._lock:
            if self.state == self.GIVEN_UP:
                raise GroupGivenUp
            self.state = self.COMMITTING

    def give_up(self) -> bool:
        """Whether the group will never commit (given up now, or before)."""
        with self._lock:
            if self.state == self.WRITING:
                self.state = self.GIVEN_UP
            return self.state == self.GIVEN_UP


class _Pending:
    """An item put, until its group is written: the future its caller awaits on its event
    loop, its group, or given up before it had one."""

    __slots__ = ("future", "given_up", "group", "item", "loop")

    def __init__(
        self,
        item: Any,
        loop: asyncio.AbstractEventLoop | None,
        future: asyncio.Future[Any] | None,
    ) -> None:
        self.item = item
        self.loop = loop
        self.future = future
        self.group: _Group | None = None
        self.given_up = False


class CommitQueue(Generic[T, R]):
    """One process's writer thread of grouped journal writes (see the module)."""

    def __init__(
        self, write: Write[T, R], *, name: str, timeout_s: float, max_group: int = MAX_GROUP
    ) -> None:
        self._write = write
        self._name = name
        self._timeout_s = timeout_s
        self._max_group = max_group
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Guards each pending item's group and given-up mark.
        self._pending_lock = threading.Lock()
        self._writers: list[threading.Thread] = []
        self._busy_since: dict[int, float] = {}  # writer thread id -> start of its group
        self._closed = False

    async def put(self, item: T) -> R:
        """Write `item` with the others waiting now; its answer once written. Raises what
        its group's write raised; `JournalUnavailable` when the group was given up (see the
        module: nothing of it is kept); `JournalInDoubt` when its commit gave no outcome in
        time; `ShuttingDown` once the queue is closed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        pending = _Pending(item, loop, future)
        self._submit(pending)
        # `wait`, not `wait_for`: the future stays uncancelled (its group may still answer),
        # at less cost than a shield.
        done, _ = await asyncio.wait((future,), timeout=self._timeout_s)
        if done:
            return future.result()
        if self._give_up(pending):
            self._unstick()
            raise JournalUnavailable(
                f"{self._name}: the journal did not answer within {self._timeout_s:g} s"
            )
        try:  # its group is committing: the commit's outcome is the answer
            return await asyncio.wait_for(future, self._timeout_s)
        except TimeoutError:
            self._unstick()
            raise JournalInDoubt(
                f"{self._name}: the commit gave no outcome within {2 * self._timeout_s:g} s"
            ) from None

    def put_nowait(self, item: T) -> None:
        """Write `item` with the next group, from any thread; nobody waits for its answer
        (a failed write is the write's to log). Dropped once the queue is closed."""
        try:
            self._submit(_Pending(item, None, None))
        except ShuttingDown:
            log.warning("journal_write_dropped", what=self._name)

    def _submit(self, pending: _Pending) -> None:
        with self._lock:
            if self._closed:
                raise ShuttingDown(f"{self._name}: stopping")
            if not self._writers:
                self._start_writer()
        self._queue.put(pending)

    def _give_up(self, pending: _Pending) -> bool:
        """Give `pending` up; whether nothing of it will be committed."""
        with self._pending_lock:
            if pending.group is None:
                pending.given_up = True
                return True
            group = pending.group
        return group.give_up()

    def _start_writer(self) -> None:
        thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._writers.append(thread)
        thread.start()

    def _unstick(self) -> None:
        """Start one more writer if every writer is stuck on its group."""
        now = time.monotonic()
        with self._lock:
            self._writers = [t for t in self._writers if t.is_alive()]
            # One C-level copy: the writers add and remove their entries meanwhile.
            started = list(self._busy_since.values())
            stuck = [s for s in started if now - s >= self._timeout_s]
            if self._closed or len(stuck) < len(self._writers):
                return
            if len(self._writers) >= MAX_WRITERS:
                return
            log.warning("journal_writer_stuck", writers=len(self._writers), what=self._name)
            self._start_writer()

    def _take_group(self, first: _Pending) -> tuple[list[_Pending], _Group]:
        """`first` and the items waiting behind it, bound to one new group; the items their
        callers gave up are left out."""
        taken = [first]
        while len(taken) < self._max_group:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # stop after this group
                break
            taken.append(item)
        gate = _Group()
        with self._pending_lock:
            group = [pending for pending in taken if not pending.given_up]
            for pending in group:
                pending.group = gate
        return group, gate

    def _run(self) -> None:
        me = threading.get_ident()
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.put(None)  # for the other writers
                return
            group, gate = self._take_group(item)
            if not group:
                continue
            replied = False

            def answer(outcomes: Sequence[R], group: list[_Pending] = group) -> None:
                nonlocal replied
                _reply_all(group, outcomes)
                replied = True

            self._busy_since[me] = time.monotonic()
            failure: BaseException | None = None
            try:
                self._write([pending.item for pending in group], answer, gate.pass_gate)
            except GroupGivenUp:
                failure = JournalUnavailable(f"{self._name}: given up by a caller, rolled back")
            except BaseException as exc:  # noqa: BLE001 - every waiting caller gets the error
                failure = exc
                if gate.state == _Group.COMMITTING and not replied:
                    # Failed in its commit: whether the database kept it is not known.
                    log.warning("journal_commit_in_doubt", what=self._name, error=repr(exc))
                    failure = JournalInDoubt(f"{self._name}: the commit failed: {exc!r}")
            finally:
                self._busy_since.pop(me, None)
            if not replied:
                failure = failure or RuntimeError(f"{self._name}: the write gave no answer")
                _reply_all(group, [failure] * len(group))

    def close(self, *, timeout_s: float = 10.0) -> None:
        """Finish the groups already put, then stop the writers."""
        with self._lock:
            self._closed = True
            writers = list(self._writers)
        if writers:
            self._queue.put(None)
            deadline = time.monotonic() + timeout_s
            for thread in writers:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))


def in_one_transaction(journal: Journal, *, timeout_s: float) -> CommitQueue[Job, Any]:
    """A worker's queue: each item a job run on one connection, in the transaction shared
    with the others waiting; its answer what it returned. A job that raises fails its whole
    group, and nothing of the group is kept (a job catches what it can handle itself)."""

    def write(jobs: list[Job], answer: Callable[[Sequence[Any]], None], gate: CommitGate) -> None:
        with journal.transaction(f"{len(jobs)} delivery writes") as conn:
            results = [job(conn) for job in jobs]
            gate()
        answer(results)

    return CommitQueue(write, name="journal-writes", timeout_s=timeout_s)


def _reply_all(group: Sequence[_Pending], outcomes: Sequence[Settled]) -> None:
    """Each caller's answer, handed to its event loop: one wake-up per loop and group."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Settled]]] = {}
    for pending, outcome in zip(group, outcomes, strict=True):
        if pending.loop is None or pending.future is None:
            continue  # put without a caller waiting
        by_loop.setdefault(pending.loop, []).append((pending.future, outcome))
    for loop, answers in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle_all, answers)
        except RuntimeError:  # the event loop is gone: its process is stopping
            log.warning("commit_reply_lost")


def _settle_all(answers: list[tuple[asyncio.Future[Any], Settled]]) -> None:
    for future, outcome in answers:
        _settle(future, outcome)


def _settle(future: asyncio.Future[Any], outcome: Settled) -> None:
    if future.done():  # the caller stopped waiting (a request's client went away)
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
