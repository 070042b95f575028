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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(self._stop,), name="sqlite-checkpoint", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it to close its connection: the engine's last
        connection to close then checkpoints the WAL into the file, as SQLite's last
        connection does."""
        with self._lock:
            self._stop.set()
            self._pid = 0
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=STOP_TIMEOUT_S)

    def _run(self, stop: threading.Event) -> None:
        conn: sqlite3.Connection | None = None
        failing = False
        try:
            while not stop.wait(CHECKPOINT_EVERY_S):
                if not os.path.exists(self._database):
                    return  # removed: nothing left to checkpoint
                try:
                    if conn is None:
                        # `mode=rw`: never creates the file.
                        uri = f"file:{urllib.parse.quote(self._database)}?mode=rw"
                        conn = sqlite3.connect(uri, uri=True, timeout=0, check_same_thread=False)
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    failing = False
                except sqlite3.Error as exc:
                    if not failing:  # once per spell of failures, not twice a second
                        log.warning(
                            "sqlite_checkpoint_failed", database=self._database, error=str(exc)
                        )
                    failing = True
                    if conn is not None:
                        conn.close()
                        conn = None
        finally:
            if conn is not None:
                conn.close()
