"""A commit the intake answered 202 for must survive an OS crash or a power cut: every
journal connection runs with the database's durable commit settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from app.errors import ConfigError
from app.journal.engine import make_engine
from tests.support.processes import REPO

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal

PIPELINE = str(Path(sys.executable).with_name("pipeline"))
# `PRAGMA synchronous` answers with a number: 2 is FULL.
SQLITE_FULL = 2
# Journal connections checked out at once: each is a connection of its own, not one reused.
AT_ONCE = 3


def test_every_journal_connection_commits_durably(database_url):
    backend = make_url(database_url).get_backend_name()
    if backend == "postgresql":
        # The database's own default says not to wait for the disk; the journal must not
        # follow it.
        plain = create_engine(database_url, poolclass=NullPool)
        with plain.connect() as conn:
            name = conn.execute(text("SELECT current_database()")).scalar_one()
            conn.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
            conn.commit()
        with plain.connect() as conn:  # a new session gets the database's default
            assert conn.execute(text("SHOW synchronous_commit")).scalar_one() == "off"
        plain.dispose()
    engine = make_engine(database_url)
    try:
        conns = [engine.connect() for _ in range(AT_ONCE)]
        try:
            for conn in conns:
                if backend == "sqlite":
                    assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
                    assert conn.exec_driver_sql("PRAGMA synchronous").scalar_one() == SQLITE_FULL
                else:
                    assert backend == "postgresql", backend
                    assert conn.execute(text("SHOW synchronous_commit")).scalar_one() == "on"
                    # A stuck statement or lock wait fails, and a vanished peer is given up.
                    assert conn.execute(text("SHOW statement_timeout")).scalar_one() == "15s"
                    assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "5s"
                    # A session left idle in a transaction (its host cut off) is ended.
                    idle = "SHOW idle_in_transaction_session_timeout"
                    assert conn.execute(text(idle)).scalar_one() == "10s"
                    given = conn.connection.dbapi_connection.info.get_parameters()
                    assert (given["keepalives"], given["tcp_user_timeout"]) == ("1", "10000")
                # Ends the transaction (on SQLite it holds the writers' turn) and keeps the
                # connection checked out, so the next one is another connection.
                conn.rollback()
        finally:
            for conn in conns:
                conn.close()
    finally:
        engine.dispose()


@pytest.mark.journal_independent
@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_a_journal_that_cannot_be_wal_is_refused_with_one_line_naming_the_setting(url):
    engine = make_engine(url)
    try:
        with pytest.raises(ConfigError) as caught, engine.connect():
            pass
    finally:
        engine.dispose()
    assert "PIPELINE_DATABASE_URL" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.journal_independent
@pytest.mark.parametrize(
    "command",
    [
        ["db", "upgrade"],
        ["schedules", "list"],
        ["status"],
        ["intake"],
        ["worker", "order"],
        ["beat"],
    ],
)
def test_the_command_line_refuses_an_in_memory_journal_with_one_line(command, tmp_path):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")},
        "PIPELINE_DATABASE_URL": "sqlite://",
        # Nothing listens there: no command may get as far as waiting for Redis.
        "PIPELINE_REDIS_URL": "redis://127.0.0.1:9/0",
    }
    result = subprocess.run(
        [PIPELINE, *command],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "configuration error" in lines[0]
    assert "PIPELINE_DATABASE_URL" in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
