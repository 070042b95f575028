"""Group commit for the intake: the records of concurrent requests are accepted together.

Requests hand their record to one thread per process, which takes everything waiting
(up to `MAX_GROUP`) and accepts it with `Acceptor.accept_many`: one journal transaction, one push
per line, one more transaction to mark them enqueued. Each request still waits for the
commit that holds its row, and for its push, before it answers (not for the marking: a
record pushed but still `received` loses nothing), and a request that arrives while a
group is being written joins the next group: nothing waits on a timer."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from app.delivery.accept import Acceptance, Acceptor
from app.errors import JournalUnavailable, ShuttingDown
from app.journal.store import NewRecord
from app.logs import get_logger

log = get_logger(__name__)

# The most records one group commits.
MAX_GROUP = 256
# Writer threads at most: one, and more only while every one is stuck on a journal that
# does not answer (a connection a network blackholed hangs until TCP gives it up).
MAX_WRITERS = 3

Settled = Acceptance | BaseException
Reply = Callable[[Settled], None]
_Group = list[tuple[NewRecord, Reply]]


class GroupAccept:
    """One process's writer thread of grouped acceptances.

    A request waits at most `timeout_s` for its group: past it, it fails with
    `JournalUnavailable` (503) and claims nothing, whatever the journal does later. When
    every writer has been stuck on one group for that long, another writer starts (up to
    `MAX_WRITERS`), so the requests behind a hung connection are not held by it."""

    def __init__(
        self,
        acceptor: Acceptor,
        *,
        clock: Callable[[], datetime],
        max_group: int = MAX_GROUP,
        timeout_s: float = 10.0,
    ) -> None:
        self._acceptor = acceptor
        self._clock = clock
        self._max_group = max_group
        self._timeout_s = timeout_s
        self._queue: queue.SimpleQueue[tuple[NewRecord, Reply] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._writers: list[threading.Thread] = []
        self._busy_since: dict[int, float] = {}  # writer thread id -> start of its group
        self._closed = False

    def submit(self, new: NewRecord, reply: Reply) -> None:
        """Accept `new` in the next group; `reply` gets its `Acceptance` or exception."""
        with self._lock:
            if self._closed:
                raise ShuttingDown("the intake is stopping")
            if not self._writers:
                self._start_writer()
        self._queue.put((new, reply))

    def _start_writer(self) -> None:
        thread = threading.Thread(target=self._run, name="group-accept", daemon=True)
        self._writers.append(thread)
        thread.start()

    async def accept(self, new: NewRecord) -> Acceptance:
        """Accept `new` with the others waiting now. Raises what `Acceptor.accept_many` raises, and
        `JournalUnavailable` when its group is not written within `timeout_s`."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Acceptance] = loop.create_future()

        def reply(outcome: Settled) -> None:
            loop.call_soon_threadsafe(_settle, future, outcome)

        self.submit(new, reply)
        try:
            return await asyncio.wait_for(future, self._timeout_s)
        except TimeoutError:
            self._unstick()
            raise JournalUnavailable(
                f"the journal did not answer within {self._timeout_s:g} s"
            ) from None

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
            log.warning(
                "journal_writer_stuck", writers=len(self._writers), timeout_s=self._timeout_s
            )
            self._start_writer()

    def _take_group(self, first: tuple[NewRecord, Reply]) -> _Group:
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

            def answer(outcomes: list[Acceptance], group: _Group = group) -> None:
                nonlocal replied
                _reply_all(group, outcomes)
                replied = True

            self._busy_since[me] = time.monotonic()
            try:
                # The requests are answered once their records are committed and pushed,
                # before they are marked enqueued.
                self._acceptor.accept_many(
                    [new for new, _ in group], clock=self._clock, on_admitted=answer
                )
            except BaseException as exc:  # noqa: BLE001 - every waiting request gets the error
                if not replied:
                    _reply_all(group, [exc] * len(group))
            finally:
                self._busy_since.pop(me, None)

    def close(self, *, timeout_s: float = 10.0) -> None:
        """Finish the groups already submitted, then stop the writers."""
        with self._lock:
            self._closed = True
            writers = list(self._writers)
        if writers:
            self._queue.put(None)
            deadline = time.monotonic() + timeout_s
            for thread in writers:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _reply_all(group: _Group, outcomes: Sequence[Settled]) -> None:
    for (_new, reply), outcome in zip(group, outcomes, strict=True):
        try:
            reply(outcome)
        except RuntimeError:  # the event loop is gone: the intake is stopping
            log.warning("group_accept_reply_lost")


def _settle(future: asyncio.Future[Acceptance], outcome: Settled) -> None:
    if future.done():  # the request was cancelled (its client went away)
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
