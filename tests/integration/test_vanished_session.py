"""A journal session that goes silent inside a transaction (its host cut off, its process
frozen) gives its row locks up: the server ends it, so other hosts can take its records
over without waiting for the link to come back."""

from __future__ import annotations

import contextlib
import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from app.journal.engine import make_engine
from tests.support.processes import wait_for

pytestmark = pytest.mark.journal


def test_a_session_silent_inside_a_transaction_gives_its_row_locks_up(database_url):
    if database_url.startswith("sqlite"):
        pytest.skip("SQLite has no sessions of other hosts: the server side is PostgreSQL's")
    engine = make_engine(database_url)
    silent = engine.connect()
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE held (id integer PRIMARY KEY, n integer)"))
            conn.execute(text("INSERT INTO held VALUES (1, 0)"))
        silent.begin()
        silent.execute(text("UPDATE held SET n = 1 WHERE id = 1"))  # then it says no more
        silent_since = time.monotonic()

        def taken() -> bool:
            try:
                with engine.begin() as conn:
                    conn.execute(text("UPDATE held SET n = 2 WHERE id = 1"))
            except DBAPIError:  # the lock wait timed out: the row is still held
                return False
            return True

        wait_for(taken, timeout_s=30, what="the silent session's row lock to be given up")
        print(f"\nrow lock given up after {time.monotonic() - silent_since:.1f} s")
    finally:
        with contextlib.suppress(DBAPIError):
            silent.close()
        engine.dispose()
