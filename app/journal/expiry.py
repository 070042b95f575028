"""Retention's statement: the expired `done` records, deleted with their attempts."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, delete, select

from app.journal.models import RecordStatus, record_attempts, records
from app.journal.store import among, unindexed_status


def delete_done_before(conn: Connection, *, before: datetime, limit: int) -> int:
    """Delete the `limit` oldest `done` records finished before `before`, and their
    attempts. Never an unfinished one (nor one moved out of `done` meanwhile). Returns how
    many records.

    The expired records are found through the (status, finished_at) index, in its order,
    then deleted by id through the primary key: a batch reads only the rows it deletes.
    Two statements, not `DELETE … WHERE id IN (SELECT …)`: given the subquery, PostgreSQL
    may plan a hash join over the whole journal; given the ids, it looks each one up."""
    ids = list(
        conn.execute(
            select(records.c.id)
            .where(
                records.c.status == RecordStatus.DONE.value,
                records.c.finished_at < before,
            )
            .order_by(records.c.finished_at)
            .limit(limit)
        ).scalars()
    )
    if not ids:
        return 0
    result = conn.execute(
        delete(records).where(
            among(conn, records.c.id, ids), unindexed_status == RecordStatus.DONE.value
        )
    )
    deleted: int = result.rowcount
    if deleted < len(ids):
        # One left `done` meanwhile (a replay took it): it keeps its attempts.
        left = set(
            conn.execute(select(records.c.id).where(among(conn, records.c.id, ids))).scalars()
        )
        ids = [i for i in ids if i not in left]
    # Their attempts go with them, in this transaction.
    conn.execute(delete(record_attempts).where(among(conn, record_attempts.c.record_id, ids)))
    return deleted
