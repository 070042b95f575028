"""The pipeline's two threading tools: `LoopThread`, the one daemon loop every background
job runs on (flushing counters, sending alerts, renewing a lock, a heartbeat…), and
`Recent`, a value computed at most once per lifetime however many threads ask for it."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Final, Generic, TypeVar

import structlog

T = TypeVar("T")

log = structlog.get_logger(__name__)

# What a step returns to end its loop (the thread ends; `start()` may begin another).
STOP: Final = -1.0
# Every loop of this process: a forked child gets each one's lock anew (one the parent's
# thread held at the fork would be held for ever in the child).
_LOOPS: weakref.WeakSet[LoopThread] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for loop in list(_LOOPS):
        loop._lock = threading.Lock()
        loop._wake = threading.Condition(loop._lock)


os.register_at_fork(after_in_child=_after_fork_in_child)


class LoopThread:
    """Calls `step()` on one daemon thread named `name`, at once (with `delay_first`: after
    `every_s`) and then every `every_s` (None: only when woken), until `stop()`. A step may
    return how many seconds to wait before the next one (None: `every_s`), or `STOP` to end
    the loop. `wake()` runs the next step now.

    A step that raises is logged (`failed_event`, with the loop's name) and the next comes
    on time: a background job never dies silently. With `final_step`, `stop()` runs one
    last step (on the thread, or inline when none was started), so what a step flushes is
    not left behind; a step sees `stopping` set when it is that one. Thread-safe; `start()`
    is cheap to call on every use, and a step may call `stop()` to make itself the last."""

    def __init__(
        self,
        step: Callable[[], float | None],
        *,
        name: str,
        every_s: float | None,
        final_step: bool = False,
        delay_first: bool = False,
        failed_event: str = "loop_step_failed",
    ) -> None:
        self.name = name
        self._step = step
        self._every_s = every_s
        self._final_step = final_step
        self._delay_first = delay_first
        self._failed_event = failed_event
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._woken = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        # True from a start until the loop's thread leaves `_run`, in the process `_pid`:
        # read without the lock, so that `start()` on every use (a counter's every
        # increment) costs two attributes. A forked child has the flag but not the thread.
        self._running = False
        self._pid = 0
        _LOOPS.add(self)

    @property
    def alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def start(self) -> None:
        """Start the loop unless it runs or `stop()` was called."""
        if self._running and self._pid == os.getpid():
            return
        with self._lock:
            if self._stopping or (self._running and self._pid == os.getpid()):
                return
            thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            thread.start()  # raises (no thread left to start): nothing changed, try again later
            # Set while the lock is held: the thread clears it, under the lock, as it ends.
            self._thread, self._pid, self._running = thread, os.getpid(), True

    def wake(self) -> None:
        """Run the next step now rather than at its time."""
        with self._lock:
            self._woken = True
            self._wake.notify()

    def stop(self, *, timeout_s: float) -> bool:
        """End the loop (after the step under way, and the final one) within `timeout_s`;
        returns whether the thread has ended (False when called from the loop's own step)."""
        with self._lock:
            self._stopping = True
            self._wake.notify()
            thread = self._thread
        if thread is None:
            if self._final_step:
                self._run_step()
            return True
        return self.join(timeout_s=timeout_s)

    def join(self, *, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) for the thread to end, without asking it to (a step
        that returns `STOP` ends it); returns whether no thread runs."""
        thread = self._thread
        if thread is None:
            return True
        if thread is not threading.current_thread():
            thread.join(timeout=timeout_s)
        return not thread.is_alive()

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            with self._lock:
                self._running = False

    def _loop(self) -> None:
        wait_s = None if self._delay_first else self._run_step()
        while True:
            with self._lock:
                if wait_s == STOP and not self._stopping:
                    self._running = False  # a `start()` from here on begins another
                    return
                if not self._stopping and not self._woken:
                    timeout_s = self._every_s if wait_s is None else max(wait_s, 0.0)
                    self._wake.wait(timeout=timeout_s)
                self._woken = False
                stopping = self._stopping
            if stopping:
                if self._final_step:
                    self._run_step()
                return
            wait_s = self._run_step()

    def _run_step(self) -> float | None:
        try:
            return self._step()
        except Exception:
            log.exception(self._failed_event, loop=self.name)
            return None


# How long a caller with no value to fall back on waits for another's computation before
# it computes the value itself: past the journal's own timeouts (a statement that takes
# longer has failed by then).
WAIT_S = 60.0


class Recent(Generic[T]):
    """The last value a computation gave, while it is younger than `lifetime_s` on `clock`
    (its age counts from when that computation began).

    One caller computes at a time, so computations begin at least `lifetime_s` apart. A
    caller that finds the value expired while another is computing it gets the expired
    value at once rather than waiting; one that finds no value yet waits for it (at most
    `WAIT_S`, then computes it itself). A computation that raises changes nothing: the
    error goes to its caller and the next caller tries again. Thread-safe."""

    def __init__(self, *, lifetime_s: float, clock: Callable[[], float]) -> None:
        self._lifetime_s = lifetime_s
        self._clock = clock
        # The value and when its computation began; replaced whole, so read without a lock.
        self._entry: tuple[T, float] | None = None
        self._computing = threading.Lock()  # held by the caller computing

    def _fresh(self) -> tuple[T, float] | None:
        entry = self._entry
        if entry is None or self._clock() - entry[1] >= self._lifetime_s:
            return None
        return entry

    def get(self, compute: Callable[[], T]) -> T:
        """The value, computed by `compute` when it has expired (raises what it raises)."""
        entry = self._fresh()
        if entry is not None:
            return entry[0]
        if not self._computing.acquire(blocking=False):
            entry = self._entry
            if entry is not None:
                return entry[0]  # expired, and another caller is computing the next
            if not self._computing.acquire(timeout=WAIT_S):
                return compute()
        try:
            entry = self._fresh()  # another caller computed it meanwhile
            if entry is not None:
                return entry[0]
            began_at = self._clock()
            value = compute()
            self._entry = (value, began_at)
            return value
        finally:
            self._computing.release()

    def fresh(self) -> T | None:
        """The value while it is younger than `lifetime_s`, else None; never computes."""
        entry = self._fresh()
        return None if entry is None else entry[0]

    def keep(self, value: T, *, began_at: float) -> None:
        """Keep `value`, computed elsewhere from a computation that began at `began_at`."""
        self._entry = (value, began_at)
