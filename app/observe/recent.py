"""`Recent`: a value computed at most once per lifetime, however many threads ask for it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

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
