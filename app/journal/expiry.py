"""Retention's statements: the expired final records, deleted with their attempts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Select,
    and_,
    delete,
    or_,
    select,
    union_all,
)

from app.journal.models import RecordStatus, record_attempts, records
from app.journal.store import among, unindexed_status
from app.journal.transitions import UNFINISHED

# The statuses no attempt, sweep or retry takes a record out of by itself: the record is
# done with, delivered or not (only an operator's replay, retry or cancel, or a rejected
# request sent again, moves it on). Retention deletes these, never an unfinished one.
FINAL = frozenset(RecordStatus) - UNFINISHED
# The final records that were never delivered: kept for their own number of days.
UNDELIVERED = FINAL - {RecordStatus.DONE}

# The column that says when a record of a final status became final, each the second of
# an index on (status, column) the expired records are found through, oldest first.
# `done`: finished_at, set by every write to `done` (ix_records_status_finished_at, 0006).
# The undelivered ones: updated_at (ix_records_status_updated_at, 0002). finished_at is not
# always set for them: a rejection writes only the status and updated_at, and a replay's
# claim clears finished_at, so a dead or cancelled record it puts back after a failed push
# has none. updated_at is never null, and every write to a record sets it: a final record
# is written again only as it leaves its status, or as a failed push puts it back, which
# makes it later (the record is kept longer, never deleted early).
_FINAL_SINCE: dict[RecordStatus, Column[datetime]] = {
    RecordStatus.DONE: records.c.finished_at,
    **dict.fromkeys(sorted(UNDELIVERED), records.c.updated_at),
}


@dataclass(frozen=True, kw_only=True)
class Cutoffs:
    """The final records that became final before these times are expired; None keeps
    those records whatever their age."""

    done: datetime | None
    undelivered: datetime | None

    def by_status(self) -> dict[RecordStatus, datetime]:
        """Each final status with a cutoff, and that cutoff."""
        return {
            status: before
            for status in sorted(FINAL)
            if (before := self.done if status is RecordStatus.DONE else self.undelivered)
            is not None
        }


def _expired(
    status: RecordStatus, before: datetime, *, column: ColumnElement[Any] = records.c.status
) -> ColumnElement[bool]:
    """A record of `status` that became final before `before`. `column`: the status column
    as the statement should read it."""
    return and_(column == status.value, _FINAL_SINCE[status] < before)


def _oldest(status: RecordStatus, before: datetime, *, limit: int) -> Select[Any]:
    """The `limit` expired records of `status` that became final first: (id, final_at)."""
    since = _FINAL_SINCE[status]
    head = (
        select(records.c.id, since.label("final_at"))
        .where(_expired(status, before))
        .order_by(since)
        .limit(limit)
        .subquery()
    )
    return select(head.c.id, head.c.final_at)


def delete_expired(conn: Connection, cutoffs: Cutoffs, *, limit: int) -> int:
    """Delete the `limit` expired records that became final first, whatever their final
    status, and their attempts. Never an unfinished one, nor one that since it was read
    left its status or became final again. Returns how many records.

    Each status's expired records are found through its index, in its order, at most
    `limit` of each, in one statement; the oldest `limit` of those are deleted by id
    through the primary key: a batch reads no more than `limit` rows a status. Two
    statements, not `DELETE … WHERE id IN (SELECT …)`: given the subquery, PostgreSQL may
    plan a hash join over the whole journal; given the ids, it looks each one up."""
    by_status = cutoffs.by_status()
    if not by_status:
        return 0
    found = conn.execute(
        union_all(*(_oldest(status, before, limit=limit) for status, before in by_status.items()))
    )
    oldest = sorted(found, key=lambda row: (row.final_at, row.id))[:limit]
    if not oldest:
        return 0
    still_expired = or_(
        *(_expired(s, before, column=unindexed_status) for s, before in by_status.items())
    )
    ids = [row.id for row in oldest]
    result = conn.execute(delete(records).where(among(conn, records.c.id, ids), still_expired))
    deleted: int = result.rowcount
    if deleted < len(ids):
        # One left its status, or became final again, meanwhile: it keeps its attempts.
        left = set(
            conn.execute(select(records.c.id).where(among(conn, records.c.id, ids))).scalars()
        )
        ids = [i for i in ids if i not in left]
    # Their attempts go with them, in this transaction.
    conn.execute(delete(record_attempts).where(among(conn, record_attempts.c.record_id, ids)))
    return deleted
