"""A SQLite journal's WAL is copied back into the database by a thread of the process
(app.journal.sqlite.checkpoints), not by whichever commit fills it, and the thread goes
with its engine."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from sqlalchemy import text

from app.journal.engine import make_engine
from tests.support.processes import wait_for

pytestmark = pytest.mark.journal_independent

ROW = "x" * 4000


def _checkpoint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sqlite-checkpoint"]


def test_the_wal_reaches_the_database_file_by_a_thread_while_commits_never_checkpoint(
    tmp_path: Path,
) -> None:
    database = tmp_path / "journal.db"
    before = set(_checkpoint_threads())
    engine = make_engine(f"sqlite:///{database}")
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE rows (body TEXT NOT NULL)"))
            assert conn.execute(text("PRAGMA wal_autocheckpoint")).scalar_one() == 0
        for _ in range(200):  # about 3 MB, beyond the 1,000 pages SQLite would checkpoint at
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO rows VALUES (:body)"), [{"body": ROW}] * 4)
        # The engine stays open, and no commit checkpoints: only its thread can copy the
        # rows into the database file.
        wait_for(
            lambda: database.stat().st_size > 3_000_000,
            timeout_s=10,
            what="the WAL to be checkpointed into the database file",
        )
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM rows")).scalar_one() == 800
        assert len(set(_checkpoint_threads()) - before) == 1
    finally:
        engine.dispose()
    wait_for(
        lambda: not set(_checkpoint_threads()) - before,
        timeout_s=5,
        what="the checkpoint thread to end with its engine",
    )


def test_the_checkpoint_thread_ends_when_its_database_file_is_removed(tmp_path: Path) -> None:
    database = tmp_path / "gone.db"
    before = set(_checkpoint_threads())
    engine = make_engine(f"sqlite:///{database}")
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE rows (body TEXT NOT NULL)"))
        ours = set(_checkpoint_threads()) - before
        assert len(ours) == 1
        for suffix in ("", "-wal", "-shm"):
            Path(f"{database}{suffix}").unlink(missing_ok=True)
        wait_for(
            lambda: not any(t.is_alive() for t in ours),
            timeout_s=5,
            what="the checkpoint thread to end",
        )
        assert not os.path.exists(database)  # and it never made the file again
    finally:
        engine.dispose()
