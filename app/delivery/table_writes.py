"""The built-in table sink's part of an attempt, in the transaction that claimed it: mark
the record done, write its sink row and the attempt's row, together, once, and only while
the attempt holds its lease; for a batch, all records at once where the table takes them
all, else one at a time so that one the table refuses fails alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy import Connection

from app.delivery.outcomes import attempt_row
from app.delivery.sinks import write_table_sink, write_table_sink_all
from app.journal import attempt_log, attempts
from app.journal.attempt_log import Outcome
from app.journal.models import Record

# What `write_all` did with each record: whether it finished it (None: not attempted, the
# table refused it), and the table's error, if any.
Written = dict[str, tuple[bool | None, Exception | None]]


def write_one(
    conn: Connection,
    record: Record,
    *,
    owner: str,
    started_at: datetime,
    now: datetime,
    table: str,
) -> bool:
    """Mark `record` done, write its sink row and its attempt's row: exactly once, and
    only while `owner`'s attempt holds its lease. False when it does not (another run took
    it over): only the attempt's row is written then, as `lease_lost`."""
    marked = attempts.mark_done(conn, record, owner=owner, now=now)
    if marked:
        write_table_sink(conn, record, table=table, now=now)
    outcome = Outcome.DONE if marked else Outcome.LEASE_LOST
    row = attempt_row(record, owner=owner, started_at=started_at, finished_at=now, outcome=outcome)
    attempt_log.write(conn, [row])
    return marked


def write_all(
    conn: Connection,
    batch: Sequence[Record],
    *,
    owner: str,
    started_at: datetime,
    now: datetime,
    table_of: Callable[[Record], str],
) -> Written:
    """`write_one` of each record of `batch`, in a savepoint: all of them at once, else (one
    the table refuses, say) one at a time, so that one fails alone."""
    if len(batch) > 1 and _all_at_once(
        conn, batch, owner=owner, started_at=started_at, now=now, table_of=table_of
    ):
        return {record.id: (True, None) for record in batch}
    written: Written = {}
    for record in batch:
        try:
            with conn.begin_nested():
                finished = write_one(
                    conn,
                    record,
                    owner=owner,
                    started_at=started_at,
                    now=now,
                    table=table_of(record),
                )
                written[record.id] = (finished, None)
        except Exception as exc:  # noqa: BLE001 - e.g. a payload the table refuses
            written[record.id] = (None, exc)  # the claim still commits: the attempt counts
    return written


def _all_at_once(
    conn: Connection,
    batch: Sequence[Record],
    *,
    owner: str,
    started_at: datetime,
    now: datetime,
    table_of: Callable[[Record], str],
) -> bool:
    """Mark done and write every record of `batch` (and its attempt's row), in a
    savepoint; False, with nothing of it kept, when any of it fails."""
    tables = {table_of(record) for record in batch}
    if len(tables) != 1:
        return False  # records of several tables: one at a time
    try:
        with conn.begin_nested():
            _mark_and_write_all(
                conn, batch, owner=owner, started_at=started_at, now=now, table=tables.pop()
            )
    except Exception:  # noqa: BLE001 - the caller finds it again, record by record
        return False
    return True


def _mark_and_write_all(
    conn: Connection,
    batch: Sequence[Record],
    *,
    owner: str,
    started_at: datetime,
    now: datetime,
    table: str,
) -> None:
    if attempts.mark_done_all(conn, batch, owner=owner, now=now) != len(batch):
        raise _NotAllMarked
    write_table_sink_all(conn, batch, table=table, now=now)
    rows = [
        attempt_row(
            record, owner=owner, started_at=started_at, finished_at=now, outcome=Outcome.DONE
        )
        for record in batch
    ]
    attempt_log.write(conn, rows)


class _NotAllMarked(Exception):
    """A record of the batch could not be marked: go record by record."""
