"""One transaction for the journal writes of a worker process's concurrent deliveries.

A thread pool's tasks claim their records and record their outcomes at about the same
moments; each in a transaction of its own, they would queue for the journal's one write
lock (SQLite's) and pay a commit each. Here a writer thread takes every write waiting when
it is free and runs them in one transaction: one commit for all of them."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import Connection

from app.errors import JournalUnavailable
from app.journal.journal import Journal

T = TypeVar("T")

# A write not committed within this is given up on (the journal's own timeouts end a
# transaction well before).
WAIT_S = 60.0


@dataclass(kw_only=True)
class _Write:
    job: Callable[[Connection], Any]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class SharedCommits:
    """Runs writes of several threads in one transaction, one writer thread per process."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._waiting: queue.SimpleQueue[_Write] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, what: str, job: Callable[[Connection], T]) -> T:
        """Run `job(conn)` within a transaction shared with the other writes waiting now,
        and return what it returned once that transaction is committed. Raises what the
        transaction raised (`JournalUnavailable` for a database error; every write of a
        transaction that failed fails with it, and none of it is kept)."""
        write = _Write(job=job)
        self._ensure_thread()
        self._waiting.put(write)
        if not write.done.wait(timeout=WAIT_S):
            raise JournalUnavailable(f"{what}: not committed within {WAIT_S:g} s")
        if write.error is not None:
            raise write.error
        result: T = write.result
        return result

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="journal-writes", daemon=True
                )
                self._thread.start()

    def _loop(self) -> None:
        while True:
            together = [self._waiting.get()]
            while True:
                try:
                    together.append(self._waiting.get_nowait())
                except queue.Empty:
                    break
            self._commit(together)

    def _commit(self, together: list[_Write]) -> None:
        try:
            with self._journal.transaction(f"{len(together)} delivery writes") as conn:
                for write in together:
                    write.result = write.job(conn)
        except BaseException as exc:  # noqa: BLE001 - handed to every waiting writer
            for write in together:
                write.error = exc
        finally:
            for write in together:
                write.done.set()
