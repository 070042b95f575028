"""An attempt's life in the journal: it starts by taking the record's lease, and only the
holder of that lease records its outcome (the rules: `app.journal.transitions`).

Every function takes a connection and never commits. `owner` names the attempt's process
and is unique to it (`new_owner()`); the record's attempt number is the lease's fencing token, so
an outcome of an attempt whose lease expired and was taken over changes nothing."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, select, update

from app.journal.dbclock import db_time, db_time_at
from app.journal.guards import NOW, guard, lease_free, lease_held
from app.journal.models import Record, RecordStatus, records
from app.journal.store import (
    among,
    among_param,
    built_once,
    unindexed_line,
    unindexed_status,
    update_by_id,
)
from app.journal.transitions import TRANSITIONS, Event


def new_owner() -> str:
    """A lease owner for attempts about to start in this process: `host:pid:nonce`. The
    nonce makes each owner unique, so that no two attempts ever share a fencing pair,
    even when a replay starts a record's count of attempts again."""
    return f"{socket.gethostname()[:100]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def worker_of(owner: str) -> tuple[str, int]:
    """The (host, pid) of the process whose attempts `owner` (made by `new_owner()`)
    names."""
    host, pid, _nonce = owner.rsplit(":", 2)
    return host, int(pid)


def _lease_values(lease_s: Any) -> dict[str, Any]:
    return {
        "attempts": records.c.attempts + 1,
        "lease_owner": bindparam("owner"),
        "lease_expires_at": db_time(bindparam("lease_until"), lease_s),
        "updated_at": db_time(NOW),
    }


def _outcome_values(to: RecordStatus, now: Any = NOW) -> dict[str, Any]:
    finished = to in (RecordStatus.DONE, RecordStatus.DEAD)
    return {
        "status": to.value,
        "lease_owner": None,
        "lease_expires_at": None,
        "updated_at": db_time(now),
        "finished_at": now if finished else None,
    }


def _done_values(now: Any = NOW) -> dict[str, Any]:
    return _outcome_values(RecordStatus.DONE, now) | {"next_attempt_at": None, "last_error": None}


# Built once: the worker runs these for every record (a statement object keeps its
# compiled form's cache key; building one per call costs more than running it).
_CLAIM = (
    update(records)
    .where(records.c.id == bindparam("record_id"), *guard(Event.ATTEMPT))
    .values(**_lease_values(bindparam("lease_s")))
    .returning(*records.c)
)
_MARK_DONE = (
    update(records)
    .where(records.c.id == bindparam("record_id"), *guard(Event.SUCCEEDED), *lease_held())
    .values(**_done_values())
)


def _lease_params(owner: str, lease_s: float, now: datetime) -> dict[str, Any]:
    return {
        "owner": owner,
        "lease_s": float(lease_s),
        "lease_until": now + timedelta(seconds=lease_s),
        "now": now,
    }


def claim_attempt(
    conn: Connection, record_id: str, *, owner: str, lease_s: float, now: datetime
) -> Record | None:
    """Start an attempt of a runnable record with no live lease: count it, and take the
    lease for `lease_s` seconds. The record as claimed (its `attempts` is the attempt's
    token), or None: not runnable (final, waiting for its retry) or in flight elsewhere."""
    params = {"record_id": record_id, **_lease_params(owner, lease_s, now)}
    row = conn.execute(_CLAIM, params).first()
    return Record.from_row(row) if row else None


def claim_done_all(
    conn: Connection, record_ids: Sequence[str], *, line: str, max_attempts: int, now: datetime
) -> list[Record]:
    """Attempts that are done in the transaction that starts them (the table sink): those
    of `record_ids` that are runnable records of `line` with no live lease and an attempt
    left, now `done` (in no order); the others are left as they were. It takes no lease:
    its transaction holds the rows until it ends."""
    if not record_ids:
        return []
    params = {
        "record_ids": list(record_ids),
        "record_line": line,
        "max_attempts": max_attempts,
        "now": now,
    }
    return [Record.from_row(row) for row in conn.execute(_claims_done(conn), params)]


# `claim_attempts`' statements, by dialect and whether they name a line: built once (the
# worker's most frequent statement; building it per call cost more than running it).
_CLAIMS: dict[tuple[str, bool], Any] = {}


def _claims(conn: Connection, *, of_line: bool) -> Any:
    key = (conn.dialect.name, of_line)
    if key not in _CLAIMS:
        terms = [
            among_param(conn, records.c.id, "record_ids"),
            *guard(Event.ATTEMPT, status=unindexed_status),
        ]
        if of_line:
            terms.append(unindexed_line == bindparam("record_line"))
        _CLAIMS[key] = (
            update(records)
            .where(*terms)
            .values(**_lease_values(bindparam("lease_s")))
            .returning(*records.c)
        )
    return _CLAIMS[key]


@built_once
def _claims_done(conn: Connection) -> Any:
    """`claim_done_all`'s statement."""
    return (
        update(records)
        .where(
            among_param(conn, records.c.id, "record_ids"),
            unindexed_line == bindparam("record_line"),
            records.c.attempts < bindparam("max_attempts"),
            *guard(Event.ATTEMPT, status=unindexed_status),
        )
        .values(attempts=records.c.attempts + 1, **_done_values())
        .returning(*records.c)
    )


def claim_attempts(
    conn: Connection,
    record_ids: Sequence[str],
    *,
    owner: str,
    lease_s: float,
    now: datetime,
    line: str | None = None,
) -> list[Record]:
    """`claim_attempt` of several records in one statement (of `line` only, when given):
    those claimed, in no order."""
    if not record_ids:
        return []
    params = {"record_ids": list(record_ids), **_lease_params(owner, lease_s, now)}
    if line is not None:
        params["record_line"] = line
    rows = conn.execute(_claims(conn, of_line=line is not None), params)
    return [Record.from_row(row) for row in rows]


def mark_done(conn: Connection, record: Record, *, owner: str, now: datetime) -> bool:
    """The attempt `record` was claimed for delivered it: `done`. False, and nothing
    changed, when that attempt no longer holds the lease (another took it over) or the
    record is final."""
    params = {"record_id": record.id, "token": record.attempts, "owner": owner, "now": now}
    return conn.execute(_MARK_DONE, params).rowcount == 1


def mark_done_all(conn: Connection, claimed: Sequence[Record], *, owner: str, now: datetime) -> int:
    """`mark_done` of records `owner` claimed in this same transaction, in one statement
    (no other attempt can start in between: the transaction holds their rows). Returns
    how many were marked."""
    if not claimed:
        return 0
    result = conn.execute(
        update(records)
        .where(
            among(conn, records.c.id, [r.id for r in claimed]),
            *guard(Event.SUCCEEDED, status=unindexed_status),
            records.c.lease_owner == bindparam("owner"),
        )
        .values(**_done_values()),
        {"owner": owner, "now": now},
    )
    return result.rowcount


def mark_failed(
    conn: Connection,
    record: Record,
    *,
    owner: str,
    error: str,
    retry_at: datetime | None,
    now: datetime,
) -> bool:
    """The attempt `record` was claimed for failed: `failed`, due again at `retry_at`
    (`retry_in_s` from now on the database's clock), or `dead` when `retry_at` is None.
    False, and nothing changed, when that attempt no longer holds the lease."""
    event = Event.RETRY if retry_at else Event.DIED
    to = TRANSITIONS[event].to
    if to is None:
        raise ValueError(f"{event.value} names no status")
    values = _outcome_values(to) | {"last_error": error[:2000]}
    if retry_at is not None:
        values["next_attempt_at"] = db_time_at(now, (retry_at - now).total_seconds())
    result = conn.execute(
        update(records)
        .where(records.c.id == record.id, *guard(event), *lease_held())
        .values(**values),
        {"token": record.attempts, "owner": owner, "now": now},
    )
    return result.rowcount == 1


def give_back(
    conn: Connection,
    record: Record,
    *,
    owner: str,
    error: str,
    retry_at: datetime,
    now: datetime,
) -> bool:
    """The attempt `record` was claimed for does not count toward its line's
    `max_attempts` (the line's circuit is open: the downstream is down, not the record):
    `failed`, due again at `retry_at`, with its attempt number given back. False, and
    nothing changed, when that attempt no longer holds the lease."""
    values = _outcome_values(RecordStatus.FAILED) | {
        "last_error": error[:2000],
        "next_attempt_at": db_time_at(now, (retry_at - now).total_seconds()),
        "attempts": records.c.attempts - 1,
    }
    result = conn.execute(
        update(records)
        .where(records.c.id == record.id, *guard(Event.GIVEN_BACK), *lease_held())
        .values(**values),
        {"token": record.attempts, "owner": owner, "now": now},
    )
    return result.rowcount == 1


def postpone(
    conn: Connection, record_ids: Sequence[str], *, reason: str, retry_at: datetime, now: datetime
) -> int:
    """No attempt of `record_ids` starts now (their line's circuit is open): each that is
    runnable and not in flight waits as `failed`, due again at `retry_at`, without an
    attempt spent. Returns how many were moved."""
    values = {
        "status": RecordStatus.FAILED.value,
        "last_error": reason[:2000],
        "next_attempt_at": db_time_at(now, (retry_at - now).total_seconds()),
        "updated_at": db_time(now),
    }
    return update_by_id(conn, record_ids, Event.POSTPONED, values, now=now)


def why_not_claimed(conn: Connection, record_id: str, *, now: datetime) -> tuple[str, str | None]:
    """Why `claim_attempt` found nothing to run: `unknown`, `in_flight` (a live lease),
    or the record's status; and the record's line (None: unknown)."""
    row = conn.execute(
        select(
            records.c.status, records.c.lease_owner, records.c.line, lease_free(now).label("free")
        ).where(records.c.id == record_id)
    ).first()
    if row is None:
        return "unknown", None
    if row.lease_owner is not None and not row.free:
        return "in_flight", row.line
    return str(row.status), row.line
