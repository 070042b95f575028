"""The journal's SQL for an operator's actions on records: a retry (`failed`, `dead` or
`rejected` → `enqueued`, to be pushed now) and a cancel (anything unfinished →
`cancelled`). Like `app.journal.store`, every function takes a connection and never
commits; every move is guarded by its rule in `app.journal.transitions`, and neither
touches a record in flight: one whose attempt holds a live lease, or one `enqueued` in the
current epoch (its message is on its queue or held by a worker), as replay judges it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, false, func, or_, select, update

from app.journal.dbclock import db_time
from app.journal.guards import guard
from app.journal.models import Record, RecordStatus, records
from app.journal.store import (
    RecordFilter,
    RecordKey,
    among,
    filtered,
    list_record_keys,
    unindexed_status,
)
from app.journal.transitions import TRANSITIONS, Event


def takes(event: Event) -> frozenset[RecordStatus]:
    """The statuses `event` moves a record from."""
    return TRANSITIONS[event].sources


def actionable(
    event: Event,
    *,
    epoch: str | None,
    now: datetime,
    status: ColumnElement[Any] = records.c.status,
) -> list[ColumnElement[bool]]:
    """What `event` asks of a record, as `WHERE` terms: one of its statuses, no live lease,
    and, for an `enqueued` one, a push in another epoch than `epoch` (None: the epoch is
    not known, so every `enqueued` record counts as in flight). An `enqueued` record with
    no epoch is being pushed now: in flight too."""
    terms = guard(event, status=status, now=now)
    if RecordStatus.ENQUEUED in takes(event):
        gone = records.c.queue_epoch != epoch if epoch is not None else false()
        terms.append(or_(status != RecordStatus.ENQUEUED.value, gone))
    return terms


def count_actionable(
    conn: Connection, where: RecordFilter, event: Event, *, epoch: str | None, now: datetime
) -> int:
    """How many records `where` selects that `event` would move now (a dry run)."""
    only = narrowed(where, event)
    if only is None:
        return 0
    query = filtered(select(func.count()).select_from(records), only)
    query = query.where(*actionable(event, epoch=epoch, now=now))
    return int(conn.execute(query).scalar_one())


def narrowed(where: RecordFilter, event: Event) -> RecordFilter | None:
    """`where` with its statuses narrowed to those `event` takes (all of them when it names
    none); None when it names only statuses `event` does not take."""
    if not where.statuses:
        return replace(where, statuses=sorted(takes(event)))
    statuses = [s for s in where.statuses if s in takes(event)]
    return replace(where, statuses=statuses) if statuses else None


def cancel(
    conn: Connection, record_ids: Sequence[str], *, epoch: str | None, now: datetime
) -> list[Record]:
    """`… → cancelled` for the records of `record_ids` that are unfinished and not in
    flight: final, never delivered. Returns those cancelled."""
    if not record_ids:
        return []
    to = RecordStatus.CANCELLED.value
    rows = conn.execute(
        update(records)
        .where(
            among(conn, records.c.id, record_ids),
            *actionable(Event.CANCELLED, epoch=epoch, now=now, status=unindexed_status),
        )
        .values(
            status=to,
            finished_at=now,
            next_attempt_at=None,
            lease_owner=None,
            lease_expires_at=None,
            updated_at=db_time(now),
        )
        .returning(*records.c)
    )
    return [Record.from_row(row) for row in rows]


def claim_retry(conn: Connection, record_ids: Sequence[str], *, now: datetime) -> list[Record]:
    """`failed | dead | rejected → enqueued` for the records of `record_ids` with no live
    lease, with no epoch until pushed (`claims.set_epoch`), their retry due now and no
    longer finished, and a fresh set of attempts, as a replay gives (their count starts
    again; a dead record's is spent). Returns those claimed: only those may be pushed."""
    if not record_ids:
        return []
    rows = conn.execute(
        update(records)
        .where(
            among(conn, records.c.id, record_ids),
            *actionable(Event.RETRIED, epoch=None, now=now, status=unindexed_status),
        )
        .values(
            status=RecordStatus.ENQUEUED.value,
            queue_epoch=None,
            attempts=0,
            next_attempt_at=None,
            finished_at=None,
            lease_owner=None,
            lease_expires_at=None,
            updated_at=db_time(now),
        )
        .returning(*records.c)
    )
    return [Record.from_row(row) for row in rows]


def page(
    conn: Connection, where: RecordFilter, event: Event, *, limit: int, after: str | None
) -> list[RecordKey]:
    """The next `limit` records by id after `after` that `where` selects in a status
    `event` takes (keyset pages: a record moved by an earlier page is never met again)."""
    only = narrowed(where, event)
    return [] if only is None else list_record_keys(conn, only, limit=limit, after=after)
