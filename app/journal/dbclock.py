"""One clock for the journal's thresholds: the database's.

Grace periods, retry times and lease expiries are compared in SQL. Compared against the
time of whichever host runs the statement, a host whose clock runs ahead would take a
record of another host as overdue (a beat 5 s fast pushed every fresh record twice). On
PostgreSQL "now" in those comparisons is therefore the server's (`now()`, the
transaction's start), and so are the times written to be compared so: a record's
`created_at` and `updated_at` (a grace period counts from them: written by an intake whose
clock is 30 s behind, a fresh record would look overdue and be pushed twice), a lease's
expiry, a retry's due time. SQLite is a file on the one host all its processes share, so
there it is the time the caller passes. `finished_at` (retention counts days from it) and
the attempts' own times are the writer's clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Float, literal
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from app.journal.models import UtcDateTime


class _DbTime(FunctionElement[datetime]):
    """`given` where the caller's clock is the database's (SQLite); elsewhere the
    database's `now()` plus `offset_s` seconds, and `given` is not sent."""

    inherit_cache = True
    name = "db_time"
    type = UtcDateTime()


@compiles(_DbTime)
def _render_given(element: _DbTime, compiler: SQLCompiler, **kw: Any) -> str:
    given, _offset = element.clauses.clauses
    return compiler.process(given, **kw)


@compiles(_DbTime, "postgresql")
def _render_server_time(element: _DbTime, compiler: SQLCompiler, **kw: Any) -> str:
    _given, offset = element.clauses.clauses
    seconds = compiler.process(offset, **kw)
    return f"(now() + make_interval(secs => CAST({seconds} AS DOUBLE PRECISION)))"


def db_time(given: Any, offset_s: Any = 0.0) -> ColumnElement[datetime]:
    """The time `offset_s` seconds from now on the database's clock; `given` is that
    time on the caller's clock. Each is a value or a bind parameter (of a statement built
    once, run with its parameters)."""
    if isinstance(given, datetime):
        given = literal(given, UtcDateTime())
    if isinstance(offset_s, int | float):
        offset_s = literal(float(offset_s), Float())
    return _DbTime(given, offset_s)


def db_time_at(now: datetime, offset_s: float) -> ColumnElement[datetime]:
    """`db_time` of `now + offset_s` seconds."""
    return db_time(now + timedelta(seconds=offset_s), offset_s)
