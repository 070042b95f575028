"""Group commit for the intake: the records of concurrent requests are accepted together.

Requests hand their record to one thread per process, which takes everything waiting
(up to `MAX_GROUP`) and accepts it with `accept_many`: one journal transaction, one push
per line, one more transaction to mark them enqueued. Each request still waits for the
commit that holds its row, and for its push, before it answers (not for the marking: a
record pushed but still `received` loses nothing), and a request that arrives while a
group is being written joins the next group: nothing waits on a timer."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Sequence
from datetime import datetime

from app.acceptance import Acceptance, accept_many
from app.journal.store import NewRecord
from app.logs import get_logger
from app.runtime import Runtime

log = get_logger(__name__)

# The most records one group commits.
MAX_GROUP = 256

Outcome = Acceptance | BaseException
Reply = Callable[[Outcome], None]
_Group = list[tuple[NewRecord, Reply]]


class GroupAccept:
    """One process's writer thread of grouped acceptances."""

    def __init__(
        self, rt: Runtime, *, clock: Callable[[], datetime], max_group: int = MAX_GROUP
    ) -> None:
        self._rt = rt
        self._clock = clock
        self._max_group = max_group
        self._queue: queue.SimpleQueue[tuple[NewRecord, Reply] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, new: NewRecord, reply: Reply) -> None:
        """Accept `new` in the next group; `reply` gets its `Acceptance` or exception."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the intake is stopping")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="group-accept", daemon=True)
                self._thread.start()
        self._queue.put((new, reply))

    async def accept(self, new: NewRecord) -> Acceptance:
        """Accept `new` with the others waiting now. Raises what `accept_many` raises."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Acceptance] = loop.create_future()

        def reply(outcome: Outcome) -> None:
            loop.call_soon_threadsafe(_settle, future, outcome)

        self.submit(new, reply)
        return await future

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
        while True:
            item = self._queue.get()
            if item is None:
                return
            group = self._take_group(item)
            replied = False

            def answer(outcomes: list[Acceptance], group: _Group = group) -> None:
                nonlocal replied
                _reply_all(group, outcomes)
                replied = True

            try:
                # The requests are answered once their records are committed and pushed,
                # before they are marked enqueued.
                accept_many(
                    self._rt, [new for new, _ in group], clock=self._clock, on_admitted=answer
                )
            except BaseException as exc:  # noqa: BLE001 - every waiting request gets the error
                if not replied:
                    _reply_all(group, [exc] * len(group))

    def close(self, *, timeout_s: float = 10.0) -> None:
        """Finish the groups already submitted, then stop the thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=timeout_s)


def _reply_all(group: _Group, outcomes: Sequence[Outcome]) -> None:
    for (_new, reply), outcome in zip(group, outcomes, strict=True):
        try:
            reply(outcome)
        except RuntimeError:  # the event loop is gone: the intake is stopping
            log.warning("group_accept_reply_lost")


def _settle(future: asyncio.Future[Acceptance], outcome: Outcome) -> None:
    if future.done():  # the request was cancelled (its client went away)
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
