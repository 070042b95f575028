"""`make_engine(url)`: the journal's engine, SQLite in WAL mode or PostgreSQL (psycopg 3)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError

from app.journal.sqlite_writers import WriterTurnConnection, begin_in_turn, lock_path_for

# How long a SQLite writer waits for the lock before the journal counts as unavailable.
SQLITE_BUSY_TIMEOUT_S = 30
_BUSY_TIMEOUT_PRAGMA = f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}"
# A PostgreSQL that does not answer within this is unavailable: fail fast, answer 503.
PG_CONNECT_TIMEOUT_S = 5
# A pooled PostgreSQL connection idle for longer than this is pinged before it is used.
PING_AFTER_IDLE_S = 1.0


def make_engine(url: str, *, pool_size: int = 5) -> Engine:
    """Build the engine for `url`. Touches no database until first used.

    A pooled connection idle past `PING_AFTER_IDLE_S` is pinged before use, so one that a
    proxy dropped while idle is replaced instead of failing the request (DESIGN §1,
    incident 4). One in steady use is not pinged: its last statement has just worked, and
    a ping cost every transaction a round trip (a third of the intake's group-commit
    thread on PostgreSQL, py-spy). If such a connection died anyway (the server
    restarted), its transaction fails like any journal error (503 at the intake, the
    message requeued at a worker) and SQLAlchemy replaces the pool's connections."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(url)
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql":
        connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=10,
        pool_recycle=1800,
        connect_args=connect_args,
    )
    if parsed.get_backend_name() == "postgresql":
        event.listen(engine, "connect", _plan_each_execution)
    _ping_after_idle(engine)
    return engine


def _ping_after_idle(engine: Engine) -> None:
    @event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.pop("idle_since", None)
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_S:
            return  # new, or back in the pool only a moment ago
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as exc:
            # The pool drops this connection and checks out another (SQLAlchemy's
            # pessimistic disconnect handling).
            raise DisconnectionError(str(exc)) from exc


def _plan_each_execution(dbapi_connection: Any, _record: Any) -> None:
    """psycopg prepares a statement run five times on a connection, and PostgreSQL may
    then keep one generic plan for it, made for the table as it was. Made on a journal
    still nearly empty, that plan is a sequential scan, and the connection kept using it
    while the table grew: the intake's id-picked UPDATE took 2-7 ms a group, scanning
    every row. Planned for each execution, a statement sees the table as it is now."""
    cursor = dbapi_connection.cursor()
    cursor.execute("SET plan_cache_mode = force_custom_plan")
    cursor.close()
    dbapi_connection.commit()  # a session setting that a later rollback does not undo


def _sqlite_engine(url: str) -> Engine:
    lock_path = lock_path_for(make_url(url).database)
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
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(_BUSY_TIMEOUT_PRAGMA)
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # Take the write lock up front: a deferred transaction that reads, then writes,
        # can fail at once with SQLITE_BUSY instead of waiting for the lock.
        # Writers take turns first (app.journal.sqlite_writers says why).
        begin_in_turn(connection.connection.dbapi_connection, timeout_s=SQLITE_BUSY_TIMEOUT_S)

    return engine
