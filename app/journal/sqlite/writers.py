"""SQLite's writers take turns through a lock file before they ask SQLite for its lock.

SQLite has one write lock. A writer that finds it taken sleeps in SQLite's busy handler,
by steps that grow to 100 ms, and retries; meanwhile writers that arrive later take the
lock in its gaps. Under a busy journal (a flooded line's workers writing beside another
line's) one unlucky writer waited hundreds of milliseconds for a lock held about one at a
time. Each journal transaction here first takes an exclusive `flock` on a file beside the
database and holds it until its commit or rollback, so SQLite's lock is free whenever a
writer asks for it. A waiter first takes its place in line (a second lock file), then
tries the turn every 0.1 ms: a writer that has just ended its turn cannot take the next
one ahead of the writer already waiting. The lock files only order the pipeline's own
writers; anything else opening the journal still meets SQLite's lock and busy timeout.

Reads take no turn and no lock (`begin_reading`): in WAL a reader sees the snapshot its
transaction began with and neither waits for a writer nor holds one up. Such a
transaction is made read-only (`PRAGMA query_only`), so that a write in it fails at once
instead of meeting the lock it did not take."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from typing import Any

# The lock files this process has open. A forked child closes its copies: a child that
# outlived a parent killed while holding the lock would otherwise keep holding it.
_open_fds: set[int] = set()


def _close_inherited() -> None:
    for fd in _open_fds:
        os.close(fd)
    _open_fds.clear()


os.register_at_fork(after_in_child=_close_inherited)

# Between two tries at a lock file held by another writer: a journal transaction holds
# the turn for about a millisecond. The writer first in line tries the turn itself more
# often, so the turn does not sit idle once it is free.
POLL_S = 0.001
NEXT_POLL_S = 0.0001
# The file of the place first in line, beside the lock file.
_NEXT_SUFFIX = ".next"


class WriterTurnConnection(sqlite3.Connection):
    """A sqlite3 connection whose transactions hold the lock file `lock_path` (set it
    before the first transaction) from `take_turn()` to commit or rollback."""

    lock_path: str | None = None
    # Whether `PRAGMA query_only` is on: set by `begin_reading`, cleared by `begin_in_turn`.
    query_only = False
    _lock_fd: int | None = None
    _next_fd: int | None = None
    _lock_pid = 0
    _holding = False

    def take_turn(self, *, timeout_s: float) -> None:
        """Wait for the lock file. Raises `sqlite3.OperationalError` ("database is
        locked", as SQLite's own timeout does) after `timeout_s`."""
        if self.lock_path is None:
            return
        if self._lock_pid != os.getpid():  # a connection made before a fork
            self._lock_fd, self._next_fd, self._holding = None, None, False
        if self._holding:
            return
        if self._lock_fd is None or self._next_fd is None:
            self._lock_fd = _open_lock_file(self.lock_path)
            self._next_fd = _open_lock_file(self.lock_path + _NEXT_SUFFIX)
            self._lock_pid = os.getpid()
        deadline = time.monotonic() + timeout_s
        # First in line, then the turn: a writer that has just ended its turn cannot take
        # the next one ahead of the writer already waiting for it.
        _lock_by_polling(self._next_fd, deadline=deadline, every_s=POLL_S)
        try:
            _lock_by_polling(self._lock_fd, deadline=deadline, every_s=NEXT_POLL_S)
        finally:
            fcntl.flock(self._next_fd, fcntl.LOCK_UN)
        self._holding = True

    def end_turn(self) -> None:
        if self._holding and self._lock_fd is not None and self._lock_pid == os.getpid():
            self._holding = False
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            self.end_turn()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self.end_turn()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.end_turn()
            if self._lock_pid == os.getpid():
                for fd in (self._lock_fd, self._next_fd):
                    if fd is not None:
                        _open_fds.discard(fd)
                        os.close(fd)
            self._lock_fd = self._next_fd = None


def _open_lock_file(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    _open_fds.add(fd)
    return fd


def _lock_by_polling(fd: int, *, deadline: float, every_s: float) -> None:
    """Take the `flock` of `fd`, trying every `every_s`. Raises `sqlite3.OperationalError`
    ("database is locked", as SQLite's own timeout does) at `deadline`."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise sqlite3.OperationalError("database is locked") from None
            time.sleep(every_s)
        else:
            return


def lock_path_for(database: str | None) -> str | None:
    """The lock file of a SQLite database file; None for an in-memory database."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return f"{database}-writers.lock"


def _set_query_only(dbapi_connection: Any, value: bool) -> None:
    """`PRAGMA query_only`, sent only when it changes (it is a connection's setting)."""
    if getattr(dbapi_connection, "query_only", False) != value:
        dbapi_connection.execute("PRAGMA query_only=1" if value else "PRAGMA query_only=0")
        dbapi_connection.query_only = value


def begin_reading(dbapi_connection: Any) -> None:
    """A deferred, read-only `BEGIN`: no writers' turn, no write lock."""
    _set_query_only(dbapi_connection, True)
    dbapi_connection.execute("BEGIN")


def begin_in_turn(dbapi_connection: Any, *, timeout_s: float) -> None:
    """`BEGIN IMMEDIATE`, once this connection's turn has come."""
    _set_query_only(dbapi_connection, False)
    if isinstance(dbapi_connection, WriterTurnConnection):
        dbapi_connection.take_turn(timeout_s=timeout_s)
    try:
        dbapi_connection.execute("BEGIN IMMEDIATE")
    except BaseException:
        if isinstance(dbapi_connection, WriterTurnConnection):
            dbapi_connection.end_turn()
        raise
