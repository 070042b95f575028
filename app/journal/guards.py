"""The SQL conditions of `app.journal.transitions`' rules: what an event asks of a
record's status and of its lease, as `WHERE` terms."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BindParameter, ColumnElement, bindparam, or_

from app.journal.dbclock import db_time
from app.journal.models import RecordStatus, records
from app.journal.transitions import TRANSITIONS, Event, Lease, sources

# The `now` parameter of statements built once.
NOW: BindParameter[Any] = bindparam("now", type_=records.c.updated_at.type)


def lease_free(now: Any = NOW) -> ColumnElement[bool]:
    """No live lease on the record: none was taken, or it has expired (database clock)."""
    return or_(records.c.lease_expires_at.is_(None), records.c.lease_expires_at <= db_time(now))


def lease_held() -> list[ColumnElement[bool]]:
    """The caller holds the lease: the `owner` and `token` (attempt number) parameters."""
    return [
        records.c.attempts == bindparam("token"),
        records.c.lease_owner == bindparam("owner"),
    ]


def guard(
    event: Event,
    *,
    status: ColumnElement[Any] = records.c.status,
    among: frozenset[RecordStatus] | None = None,
    now: Any = NOW,
) -> list[ColumnElement[bool]]:
    """What `event` asks of a record: one of its source statuses (narrowed to `among`),
    and no live lease where it asks for that. `status`: the status column as the
    statement should read it. A held lease's terms are `lease_held()`."""
    terms: list[ColumnElement[bool]] = [status.in_(sources(event, among=among))]
    if TRANSITIONS[event].lease is Lease.FREE:
        terms.append(lease_free(now))
    return terms
