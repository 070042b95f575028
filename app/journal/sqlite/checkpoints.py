"""SQLite's WAL is copied back into the database by a thread of each process, not by the
commit that happens to fill it.

By default SQLite checkpoints a WAL of 1,000 pages or more inside the commit that crossed
that size: that commit copies the pages and syncs the database file before it returns,
and its writer keeps the writers' turn (`app.journal.sqlite.writers`) all that time, so
every writer of every line waits behind it. Our connections turn that off
(`PRAGMA wal_autocheckpoint=0`), and a daemon thread per engine and process runs a
passive checkpoint every `CHECKPOINT_EVERY_S` on a connection of its own, outside any turn: a
passive checkpoint never waits for a reader or a writer, and the WAL is reused from its
start once a checkpoint has copied all of it. No commit then pays for a checkpoint."""

from __future__ import annotations

import os
import sqlite3
import threading
import urllib.parse

from app.telemetry.logs import get_logger
from app.threads import STOP, LoopThread

log = get_logger(__name__)

# Between two passive checkpoints of a process. A checkpoint with nothing to copy costs
# a few microseconds; at the intake's fastest, about 2 MB of WAL is written in this time.
CHECKPOINT_EVERY_S = 0.5
# How long disposing of an engine waits for its thread (a checkpoint under way) to end.
STOP_TIMEOUT_S = 10.0
# Off in our connections: the thread checkpoints instead.
AUTOCHECKPOINT_OFF = "PRAGMA wal_autocheckpoint=0"


class Checkpointer:
    """The thread that checkpoints one database file for one engine: started by the
    engine's first connection in each process (a forked child starts its own), stopped
    when the engine is disposed or the file is gone."""

    def __init__(self, database: str) -> None:
        self._database = database
        self._lock = threading.Lock()
        self._pid = 0
        self._run: _Checkpoints | None = None

    def start(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            if self._run is not None and self._pid != 0:
                # Its parent's, copied by a fork: its connection must not be used here, not
                # even closed (SQLite's rule; closing would drop this process's locks).
                _FORKED_AWAY.append(self._run)
            self._pid = os.getpid()
            self._run = _Checkpoints(self._database)
            self._run.loop.start()

    def stop(self) -> None:
        """Stop the thread and wait for it to close its connection: the engine's last
        connection to close then checkpoints the WAL into the file, as SQLite's last
        connection does."""
        with self._lock:
            forked = self._pid not in (0, os.getpid())
            self._pid = 0
            run, self._run = self._run, None
        if run is None:
            return
        if forked:
            # Its parent's, copied by a fork, never started here: not ours to stop (its
            # loop's lock may have been held at the fork), and its connection not ours to close.
            _FORKED_AWAY.append(run)
            return
        run.loop.stop(timeout_s=STOP_TIMEOUT_S)


class _Checkpoints:
    """One run of the checkpoint thread (a stopped loop never starts again): a passive
    checkpoint every `CHECKPOINT_EVERY_S` on a connection of its own, which its last step
    closes."""

    def __init__(self, database: str) -> None:
        self._database = database
        self._conn: sqlite3.Connection | None = None
        self._failing = False
        self.loop = LoopThread(
            self._step,
            name="sqlite-checkpoint",
            every_s=CHECKPOINT_EVERY_S,
            final_step=True,
            delay_first=True,
        )

    def _step(self) -> float | None:
        if self.loop.stopping or not os.path.exists(self._database):
            # Stopped, or the file was removed: nothing left to checkpoint.
            self._close()
            return STOP
        try:
            if self._conn is None:
                # `mode=rw`: never creates the file.
                uri = f"file:{urllib.parse.quote(self._database)}?mode=rw"
                self._conn = sqlite3.connect(uri, uri=True, timeout=0, check_same_thread=False)
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self._failing = False
        except sqlite3.Error as exc:
            if not self._failing:  # once per spell of failures, not twice a second
                log.warning("sqlite_checkpoint_failed", database=self._database, error=str(exc))
            self._failing = True
            self._close()
        return None

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


# The runs a forked child inherited from its parent: kept, never used (`Checkpointer.start`).
_FORKED_AWAY: list[_Checkpoints] = []
