"""A worker process's delivery slots: a record is claimed only when a delivery thread is
free to run it at once, so that no claimed record waits for a thread while its lease runs
out (a batch of records behind a hanging downstream would otherwise outlive its lease
before its delivery even began)."""

from __future__ import annotations

import threading
import time


class DeliverySlots:
    """`size` slots, taken several at a time and given back one by one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = size
        self._changed = threading.Condition()

    def take(self, most: int, *, timeout_s: float) -> int:
        """Take between 1 and `most` slots: as many as are free, waiting up to `timeout_s`
        for the first. Returns how many were taken (0: none came free in time)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._free == 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return 0
                self._changed.wait(timeout=left)
            taken = min(most, self._free)
            self._free -= taken
            return taken

    def give(self, count: int = 1) -> None:
        if count <= 0:
            return
        with self._changed:
            self._free = min(self.size, self._free + count)
            self._changed.notify_all()
