"""SQLite's writers take turns through a lock file (app.journal.sqlite.writers): a journal
transaction holds it from BEGIN to its end, every write still lands, a writer that never
gets its turn fails as SQLite's own timeout does, and a forked child never keeps its
parent's turn."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from app.journal.engine import make_engine
from app.journal.journal import Journal
from app.journal.sqlite.writers import WriterTurnConnection, lock_path_for
from tests.support.processes import KILLED_EXIT_TIMEOUT_S, REPO, wait_for

pytestmark = pytest.mark.journal_independent


@pytest.fixture
def database(tmp_path: Path) -> str:
    return str(tmp_path / "journal.db")


@pytest.fixture
def engine(database: str) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{database}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE counter (n INTEGER NOT NULL)"))
        conn.execute(text("INSERT INTO counter VALUES (0)"))
    try:
        yield engine
    finally:
        engine.dispose()


def _turn_is_free(database: str) -> bool:
    lock_path = lock_path_for(database)
    assert lock_path is not None
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing the descriptor drops a lock it took
    return True


def test_a_journal_transaction_holds_the_writers_turn_until_commit_or_rollback(
    engine: Engine, database: str
) -> None:
    assert _turn_is_free(database)
    with engine.begin() as conn:
        conn.execute(text("UPDATE counter SET n = n + 1"))
        assert not _turn_is_free(database)
    assert _turn_is_free(database)

    with contextlib.suppress(RuntimeError), engine.begin() as conn:
        conn.execute(text("UPDATE counter SET n = n + 1"))
        assert not _turn_is_free(database)
        raise RuntimeError("roll back")
    assert _turn_is_free(database)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT n FROM counter")).scalar_one() == 1


def test_a_read_transaction_takes_neither_the_writers_turn_nor_sqlites_write_lock(
    engine: Engine, database: str
) -> None:
    """A status page polling the journal must not stall the intake's commits."""
    with Journal(engine).reading() as reader:
        assert reader.execute(text("SELECT n FROM counter")).scalar_one() == 0
        assert _turn_is_free(database)
        other = sqlite3.connect(database, timeout=0)
        try:
            other.execute("BEGIN IMMEDIATE")  # SQLite's write lock: free as well
            other.execute("UPDATE counter SET n = 7")
            other.commit()
        finally:
            other.close()
        # The read's snapshot is the one it began with.
        assert reader.execute(text("SELECT n FROM counter")).scalar_one() == 0
    with Journal(engine).reading() as reader:
        assert reader.execute(text("SELECT n FROM counter")).scalar_one() == 7


def test_concurrent_writers_each_get_their_turn_and_no_write_is_lost(engine: Engine) -> None:
    writers, each = 8, 50
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(each):
                with engine.begin() as conn:
                    n = conn.execute(text("SELECT n FROM counter")).scalar_one()
                    conn.execute(text("UPDATE counter SET n = :n"), {"n": n + 1})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    with engine.connect() as conn:
        # A read, then a write of what was read: a lost update would show here.
        assert conn.execute(text("SELECT n FROM counter")).scalar_one() == writers * each


def test_a_writer_that_never_gets_its_turn_fails_as_a_locked_database(database: str) -> None:
    lock_path = lock_path_for(database)
    assert lock_path is not None
    holder = os.open(lock_path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    connection = sqlite3.connect(database, factory=WriterTurnConnection)
    try:
        assert isinstance(connection, WriterTurnConnection)
        connection.lock_path = lock_path
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            connection.take_turn(timeout_s=0.2)
        fcntl.flock(holder, fcntl.LOCK_UN)
        connection.take_turn(timeout_s=5)
        assert not _turn_is_free(database)
    finally:
        connection.close()
        os.close(holder)
    assert _turn_is_free(database)


# Holds its turn in an open transaction, forks a child that lives on, and waits.
_PARENT = """
import os, sys, time
from sqlalchemy import text
from app.journal.engine import make_engine
from app.journal.journal import Journal

engine = make_engine(f"sqlite:///{sys.argv[1]}")
conn = engine.connect()
conn.execute(text("SELECT 1"))
if os.fork() == 0:
    time.sleep(60)
    os._exit(0)
print("holding", flush=True)
time.sleep(60)
"""


def test_a_forked_child_does_not_keep_the_turn_of_a_parent_killed_holding_it(
    database: str,
) -> None:
    """A prefork worker's children outlive a parent killed with SIGKILL for a moment; a
    child holding a copy of the parent's lock file would block every writer meanwhile."""
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_PARENT), database],
        cwd=REPO,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline() == b"holding\n"
        assert not _turn_is_free(database)
        parent.kill()
        parent.wait(timeout=KILLED_EXIT_TIMEOUT_S)
        # The child (same process group) is still alive, and the turn is free.
        os.killpg(parent.pid, 0)
        wait_for(lambda: _turn_is_free(database), timeout_s=10, what="the writers' turn")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            parent.wait(timeout=KILLED_EXIT_TIMEOUT_S)
        if parent.stdout is not None:
            parent.stdout.close()


def test_a_writer_that_ends_its_turn_cannot_take_the_next_ahead_of_one_waiting(
    database: str,
) -> None:
    """Without a place in line, a writer that commits and begins again at once took the
    turn again and again while another polled for it."""
    lock_path = lock_path_for(database)
    assert lock_path is not None
    first = sqlite3.connect(database, factory=WriterTurnConnection, check_same_thread=False)
    second = sqlite3.connect(database, factory=WriterTurnConnection, check_same_thread=False)
    order: list[str] = []
    try:
        assert isinstance(first, WriterTurnConnection)
        assert isinstance(second, WriterTurnConnection)
        first.lock_path = second.lock_path = lock_path
        first.take_turn(timeout_s=5)

        def wait_then_write() -> None:
            second.take_turn(timeout_s=10)
            order.append("second")
            second.end_turn()

        waiter = threading.Thread(target=wait_then_write)
        waiter.start()
        next_in_line = os.open(f"{lock_path}.next", os.O_RDWR | os.O_CREAT)
        try:

            def in_line() -> bool:
                try:
                    fcntl.flock(next_in_line, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return True
                fcntl.flock(next_in_line, fcntl.LOCK_UN)
                return False

            wait_for(in_line, timeout_s=10, what="the second writer to wait in line")
        finally:
            os.close(next_in_line)
        first.end_turn()
        first.take_turn(timeout_s=10)  # at once: it must wait for the one in line
        order.append("first")
        first.end_turn()
        waiter.join(timeout=10)
        assert not waiter.is_alive()
        assert order == ["second", "first"]
    finally:
        first.close()
        second.close()
