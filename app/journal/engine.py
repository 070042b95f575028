"""`make_engine(url)`: the journal's engine, SQLite in WAL mode or PostgreSQL (psycopg 3).

Every journal connection commits durably: a commit the intake answered 202 for survives an
OS crash or a power cut. SQLite runs in WAL with `synchronous=FULL` (NORMAL may roll the
last commits back after a power cut) and a database that cannot be WAL is refused;
PostgreSQL sessions pin `synchronous_commit=on`, whatever the server, database or role
default says.

A connection marked `read_only(conn)` before its first statement reads in a read-only
transaction: on SQLite a deferred `BEGIN` that takes neither the writers' turn nor the
write lock (in WAL it reads its snapshot beside the writers), on PostgreSQL
`BEGIN READ ONLY`."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError, SQLAlchemyError

from app.errors import ConfigError
from app.journal.sqlite.checkpoints import AUTOCHECKPOINT_OFF, Checkpointer
from app.journal.sqlite.writers import (
    WriterTurnConnection,
    begin_in_turn,
    begin_reading,
    lock_path_for,
)

# How long a SQLite writer waits for the lock before the journal counts as unavailable.
SQLITE_BUSY_TIMEOUT_S = 30
_BUSY_TIMEOUT_PRAGMA = f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}"
# A PostgreSQL that does not answer within this is unavailable: fail fast, answer 503.
PG_CONNECT_TIMEOUT_S = 5
# A pooled PostgreSQL connection idle for longer than this is pinged before it is used.
PING_AFTER_IDLE_S = 1.0
# How long a PostgreSQL connection keeps the plans it has cached before they are made anew.
REPLAN_AFTER_S = 5.0
# Pinned for every PostgreSQL journal session: a commit returns once it is on disk (a
# server, database or role default of `off` would lose the last commits in a crash); a
# statement, or a wait for a lock, that takes longer is cancelled by the server, so a
# stuck statement fails as a journal error (503) instead of holding its caller.
PG_STATEMENT_TIMEOUT_MS = 15_000
PG_LOCK_TIMEOUT_MS = 5_000
# A session idle inside a transaction for longer than this is ended by the server, which
# rolls it back. The journal's transactions run their statements back to back (nothing
# waits on Redis or a downstream inside one), so only a client that vanished mid-way (its
# host cut off, its process frozen) stays idle that long; without the limit its row locks
# would stop every other host from taking its records over until the server's TCP
# keepalive noticed (two hours by default), or forever behind a proxy that stays up.
PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 10_000
PG_DURABLE_OPTION = (
    f"-c synchronous_commit=on -c statement_timeout={PG_STATEMENT_TIMEOUT_MS} "
    f"-c lock_timeout={PG_LOCK_TIMEOUT_MS} "
    f"-c idle_in_transaction_session_timeout={PG_IDLE_IN_TRANSACTION_TIMEOUT_MS}"
)
# A connection whose peer vanished (a host gone, a network that drops everything) is given
# up by TCP: an idle one after 5 + 3 x 2 s of unanswered keepalives, a busy one when data
# it sent stays unacknowledged for 10 s (libpq's tcp_user_timeout, Linux).
PG_KEEPALIVES: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}


# The execution option of a connection whose transactions only read.
READ_ONLY_OPTION = "journal_read_only"


def read_only(conn: Connection) -> None:
    """Make `conn`'s transactions read-only (call it before its first statement): they
    take no write lock, hold up no writer, and a write in them fails."""
    if conn.dialect.name == "postgresql":
        # SQLAlchemy's connection characteristic: psycopg begins `BEGIN READ ONLY`; reset
        # when the connection goes back to the pool.
        conn.execution_options(postgresql_readonly=True)
    conn.execution_options(**{READ_ONLY_OPTION: True})


def make_engine(url: str, *, pool_size: int = 5) -> Engine:
    """Build the engine for `url`. Touches no database until first used.

    A pooled connection idle past `PING_AFTER_IDLE_S` is pinged before use, so one that a
    proxy dropped while idle is replaced instead of failing the request. One in steady
    use is not pinged: its last statement has just worked, and a ping would cost every
    transaction a round trip. If such a connection died anyway (the server
    restarted), its transaction fails like any journal error (503 at the intake, the
    message requeued at a worker) and SQLAlchemy replaces the pool's connections.

    On PostgreSQL a connection also drops its cached plans (`DISCARD PLANS`) when it is
    checked out `REPLAN_AFTER_S` or more after it last did. psycopg prepares a statement
    a connection runs five times, and PostgreSQL may then keep one generic plan for it,
    made for the table as it was: made on a journal still nearly empty, that plan is a
    sequential scan, and it stayed while the table grew. The
    statements stay prepared; their plans are made again for the table as it is now."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(url)
    connect_args: dict[str, Any] = {}
    postgresql = parsed.get_backend_name() == "postgresql"
    if postgresql:
        connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
        connect_args |= PG_KEEPALIVES
        # connect_args replace the URL's own `options`: keep those, ours last so it wins.
        given = parsed.query.get("options")
        given_options = " ".join(given) if isinstance(given, tuple) else given
        connect_args["options"] = " ".join(filter(None, [given_options, PG_DURABLE_OPTION]))
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=10,
        pool_recycle=1800,
        connect_args=connect_args,
    )
    _check_on_checkout(engine, replan=postgresql)
    return engine


def _check_on_checkout(engine: Engine, *, replan: bool) -> None:
    @event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _check(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        now = time.monotonic()
        idle_since = record.info.pop("idle_since", None)
        planned_since = record.info.setdefault("planned_since", now)
        try:
            if replan and now - planned_since >= REPLAN_AFTER_S:
                _outside_transaction(dbapi_connection, "DISCARD PLANS")  # a ping as well
                record.info["planned_since"] = now
            elif idle_since is not None and now - idle_since >= PING_AFTER_IDLE_S:
                engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as exc:
            # The pool drops this connection and checks out another (SQLAlchemy's
            # pessimistic disconnect handling).
            raise DisconnectionError(str(exc)) from exc


def _outside_transaction(dbapi_connection: Any, sql: str) -> None:
    """Run `sql` in autocommit, as SQLAlchemy's ping does on psycopg."""
    before = dbapi_connection.autocommit
    dbapi_connection.autocommit = True
    try:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(sql)
        finally:
            cursor.close()
    finally:
        if not dbapi_connection.closed:
            dbapi_connection.autocommit = before


def _sqlite_engine(url: str) -> Engine:
    database = make_url(url).database
    lock_path = lock_path_for(database)
    # A file's WAL is checkpointed by a thread, not inside commits (see sqlite_checkpoints).
    checkpointer = Checkpointer(database) if lock_path and database else None
    engine = create_engine(
        url,
        connect_args={
            "timeout": SQLITE_BUSY_TIMEOUT_S,
            "check_same_thread": False,
            "factory": WriterTurnConnection,
        },
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite's own is deferred).
        dbapi_connection.isolation_level = None
        dbapi_connection.lock_path = lock_path
        cursor = dbapi_connection.cursor()
        mode = cursor.execute("PRAGMA journal_mode=WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            # Any other mode is not power-safe here (an in-memory database cannot be WAL):
            # refuse to work rather than answer 202 for what a crash may lose.
            cursor.close()
            dbapi_connection.close()
            raise ConfigError(
                "PIPELINE_DATABASE_URL: the SQLite journal must be a file that can use WAL "
                f"(journal_mode=WAL gave {mode[0] if mode else None!r}); "
                "an in-memory database is not durable"
            )
        # FULL: each commit is on disk before it returns (NORMAL may lose the last ones).
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute(_BUSY_TIMEOUT_PRAGMA)
        if checkpointer is not None:
            cursor.execute(AUTOCHECKPOINT_OFF)
            checkpointer.start()
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        dbapi_connection = connection.connection.dbapi_connection
        if connection.get_execution_options().get(READ_ONLY_OPTION):
            begin_reading(dbapi_connection)
            return
        # Take the write lock up front: a deferred transaction that reads, then writes,
        # can fail at once with SQLITE_BUSY instead of waiting for the lock.
        # Writers take turns first (app.journal.sqlite.writers says why).
        begin_in_turn(dbapi_connection, timeout_s=SQLITE_BUSY_TIMEOUT_S)

    if checkpointer is not None:
        event.listen(engine, "engine_disposed", lambda _engine: checkpointer.stop())
    return engine


def journal_failure_message(url: str, exc: BaseException) -> str:
    """One line for an operator about a journal that failed: the setting's name, its URL
    with the password hidden, what was tried, and the database's own first line (never a
    traceback, never the password)."""
    parsed = make_url(url)
    shown = parsed.render_as_string(hide_password=True)
    if parsed.get_backend_name() == "sqlite":
        tried = f"opening the SQLite file {parsed.database}"
    else:
        where = f"{parsed.host or 'localhost'}:{parsed.port or 5432}"
        tried = (
            f"connecting to {where}, database {parsed.database!r}, as user "
            f"{parsed.username!r}, for up to {PG_CONNECT_TIMEOUT_S} s"
        )
    cause = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    said = lines[0] if lines else type(cause).__name__
    if parsed.password:
        said = said.replace(str(parsed.password), "***")
    return (
        f"the journal database failed: PIPELINE_DATABASE_URL={shown}; tried {tried}: "
        f"{type(cause).__name__}: {said}"
    )


def refuse_unsafe_journal(url: str) -> None:
    """Open one connection to a SQLite journal and close it, so that a journal which cannot
    be made power-safe stops a long-running component at its start (`ConfigError`) rather
    than failing each request or task it later takes.

    A journal that does not answer is no error here: the components run through a journal
    outage (the intake answers 503, a worker's message is requeued). PostgreSQL is not
    opened: its durable setting is pinned in the connection request itself."""
    if make_url(url).get_backend_name() != "sqlite":
        return
    engine = make_engine(url)
    try:
        with engine.connect():
            pass
    except SQLAlchemyError:
        return
    finally:
        engine.dispose()
