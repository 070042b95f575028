"""The commit queue: the journal writes of many callers, one transaction for those waiting
together. The intake's acceptances go through one (`app.admission.accept.accept_group`), and so
do a worker's claims and outcomes (`in_one_transaction`).

Callers put an item and await its answer; a writer thread takes everything waiting (up to
`max_group`) and writes it at once. A caller that arrives while a group is being written
joins the next group: nothing waits on a timer. A caller waits at most `timeout_s`: past
it, it fails with `JournalUnavailable`, whatever the journal does later; and when every
writer has been stuck on one group that long, another writer starts (up to
`MAX_WRITERS`), so the groups behind a hung connection (one a network blackholed hangs
until TCP gives it up) are not held by it."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection

from app.errors import JournalUnavailable, ShuttingDown
from app.journal.journal import Journal
from app.logs import get_logger

log = get_logger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# The most items one group writes.
MAX_GROUP = 256
# Writer threads at most: one, and more only while every one is stuck on a journal that
# does not answer.
MAX_WRITERS = 3

Settled = Any  # an item's answer, or the exception that failed it
Reply = Callable[[Settled], None]
# A group's writer: writes the items, then calls `answer` with one answer per item (it may
# answer before it returns: the intake answers once its records are committed and pushed).
Write = Callable[[list[T], Callable[[Sequence[R]], None]], None]
# A write of the worker's: run on the group's connection, inside its transaction.
Job = Callable[[Connection], Any]


class CommitQueue(Generic[T, R]):
    """One process's writer thread of grouped journal writes (see the module)."""

    def __init__(
        self, write: Write[T, R], *, name: str, timeout_s: float, max_group: int = MAX_GROUP
    ) -> None:
        self._write = write
        self._name = name
        self._timeout_s = timeout_s
        self._max_group = max_group
        self._queue: queue.SimpleQueue[tuple[T, Reply] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._writers: list[threading.Thread] = []
        self._busy_since: dict[int, float] = {}  # writer thread id -> start of its group
        self._closed = False

    async def put(self, item: T) -> R:
        """Write `item` with the others waiting now; its answer once written. Raises what
        its group's write raised, and `JournalUnavailable` when the group is not written
        within `timeout_s` (`ShuttingDown` once the queue is closed)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()

        def reply(outcome: Settled) -> None:
            loop.call_soon_threadsafe(_settle, future, outcome)

        self._submit(item, reply)
        try:
            return await asyncio.wait_for(future, self._timeout_s)
        except TimeoutError:
            self._unstick()
            raise JournalUnavailable(
                f"{self._name}: the journal did not answer within {self._timeout_s:g} s"
            ) from None

    def _submit(self, item: T, reply: Reply) -> None:
        with self._lock:
            if self._closed:
                raise ShuttingDown(f"{self._name}: stopping")
            if not self._writers:
                self._start_writer()
        self._queue.put((item, reply))

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

    def _take_group(self, first: tuple[T, Reply]) -> list[tuple[T, Reply]]:
        group = [first]
        while len(group) < self._max_group:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # stop after this group
                break
            group.append(item)
        return group

    def _run(self) -> None:
        me = threading.get_ident()
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.put(None)  # for the other writers
                return
            group = self._take_group(item)
            replied = False

            def answer(outcomes: Sequence[R], group: list[tuple[T, Reply]] = group) -> None:
                nonlocal replied
                _reply_all(group, outcomes)
                replied = True

            self._busy_since[me] = time.monotonic()
            failure: BaseException | None = None
            try:
                self._write([item for item, _ in group], answer)
            except BaseException as exc:  # noqa: BLE001 - every waiting caller gets the error
                failure = exc
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

    def write(jobs: list[Job], answer: Callable[[Sequence[Any]], None]) -> None:
        with journal.transaction(f"{len(jobs)} delivery writes") as conn:
            results = [job(conn) for job in jobs]
        answer(results)

    return CommitQueue(write, name="journal-writes", timeout_s=timeout_s)


def _reply_all(group: Sequence[tuple[Any, Reply]], outcomes: Sequence[Settled]) -> None:
    for (_item, reply), outcome in zip(group, outcomes, strict=True):
        try:
            reply(outcome)
        except RuntimeError:  # the event loop is gone: its process is stopping
            log.warning("commit_reply_lost")


def _settle(future: asyncio.Future[Any], outcome: Settled) -> None:
    if future.done():  # the caller stopped waiting (a request's client went away)
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
