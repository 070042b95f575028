"""The journal's claims for a push: the records the sweeper, the lost-message check and
replay take (`… → enqueued`) before they push them, their epoch once pushed, and what goes
back when a push fails. Like `app.journal.store`, every function takes a connection and
never commits; every move is guarded by its rule in `app.journal.transitions`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    func,
    or_,
    select,
    update,
)

from app.ids import SEPARATOR
from app.journal.dbclock import db_time, db_time_at
from app.journal.guards import guard
from app.journal.models import Record, RecordStatus, records
from app.journal.store import RecordKey, among, unindexed_status
from app.journal.transitions import Event, sources


def set_epoch(
    conn: Connection, record_ids: Sequence[str], *, epoch: str, replace: bool = False
) -> int:
    """Record the epoch of claimed records once their push happened (`replace`: also over
    the epoch they were claimed in)."""
    if not record_ids:
        return 0
    guard = [among(conn, records.c.id, record_ids), unindexed_status == RecordStatus.ENQUEUED.value]
    if not replace:
        guard.append(records.c.queue_epoch.is_(None))
    result = conn.execute(update(records).where(*guard).values(queue_epoch=epoch))
    return result.rowcount


@dataclasses.dataclass(frozen=True)
class Senders:
    """Which senders' records a claim takes: `only` that one's (with `room`: how many more
    of its records its part of the bound takes), else every sender's but `skipping`'s."""

    skipping: Sequence[str] = ()
    only: str | None = None
    room: int | None = None

    def terms(self) -> list[ColumnElement[bool]]:
        """The `WHERE` terms: a sender is its records' dedup key's namespace (compared
        exactly: SQLite's LIKE ignores case)."""
        if self.only is not None:
            return [_namespace_is(self.only)]
        return [~_namespace_is(sender) for sender in self.skipping]


def _namespace_is(sender: str) -> ColumnElement[bool]:
    prefix = sender + SEPARATOR
    return func.substr(records.c.dedup_key, 1, len(prefix)) == prefix


@dataclasses.dataclass(frozen=True, kw_only=True)
class Due:
    """Which records of `line` should be put on its queue, none of them in flight (a live
    lease): `received` ones unchanged for `received_grace_s`, `deferred` ones, `failed`
    ones whose retry is due, `enqueued` ones that can no longer be on the queue (pushed in
    another epoch than `epoch`: Redis lost everything since; a message lost alone is found
    by looking, `app.recovery.lost_messages`), and runnable ones whose attempt's lease
    expired without an outcome (its worker died, or its outcome could not be written).
    Times are compared on the database's clock (`app.journal.dbclock`), at `now`.
    `senders`: only one sender's records, or every sender's but some (see `Senders`)."""

    line: str
    now: datetime
    received_grace_s: float
    epoch: str
    senders: Senders | None = None

    def terms(self) -> list[ColumnElement[bool]]:
        """The `WHERE` terms."""
        now = self.now
        lease_expired = and_(
            records.c.lease_expires_at.is_not(None),
            records.c.lease_expires_at <= db_time(now),
            records.c.status.in_(sources(Event.ATTEMPT)),
        )
        due = or_(
            and_(
                records.c.status == RecordStatus.RECEIVED.value,
                records.c.updated_at < db_time_at(now, -self.received_grace_s),
            ),
            records.c.status == RecordStatus.DEFERRED.value,
            and_(
                records.c.status == RecordStatus.FAILED.value,
                records.c.next_attempt_at <= db_time(now),
            ),
            and_(
                records.c.status == RecordStatus.ENQUEUED.value,
                # No epoch: a sweeper is pushing it now (or died doing so: the lost-message
                # check takes it).
                records.c.queue_epoch != self.epoch,
            ),
            lease_expired,
        )
        picked = [] if self.senders is None else self.senders.terms()
        return [records.c.line == self.line, due, *picked, *guard(Event.SWEPT, now=now)]


def claim_due(conn: Connection, due: Due, *, limit: int) -> list[Record]:
    """Claim, oldest first, at most `limit` of the records `due` picks: they become
    `enqueued` with no epoch until pushed. Returns those claimed, as they were before. Safe
    with concurrent sweepers: the rows are locked (`FOR UPDATE SKIP LOCKED` on PostgreSQL;
    SQLite serialises writers) and every update is guarded by the status it was read in."""
    query = select(records).where(*due.terms()).order_by(records.c.id).limit(limit)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    found = [Record.from_row(row) for row in conn.execute(query)]
    claimed = set(claim_as_enqueued(conn, found, Event.SWEPT, now=due.now))
    return [record for record in found if record.id in claimed]


def any_due(conn: Connection, due: Due) -> bool:
    """Whether `due` picks any record (what `claim_due` would claim, given room), claiming
    nothing."""
    return conn.execute(select(records.c.id).where(*due.terms()).limit(1)).first() is not None


def _unrun_since(epoch: str, *, now: datetime, quiet_s: float) -> list[ColumnElement[bool]]:
    """An `enqueued` record pushed in `epoch` (or claimed for a push with no epoch yet: a
    push takes milliseconds, so one that has waited `quiet_s` lost its pusher), unchanged
    for `quiet_s`, whose message no attempt has taken since (no lease, live or expired):
    its message should be waiting."""
    return [
        records.c.status == RecordStatus.ENQUEUED.value,
        or_(records.c.queue_epoch == epoch, records.c.queue_epoch.is_(None)),
        records.c.lease_expires_at.is_(None),
        records.c.updated_at < db_time_at(now, -quiet_s),
    ]


def waiting_suspects(
    conn: Connection,
    *,
    line: str,
    epoch: str,
    now: datetime,
    quiet_s: float,
    limit: int,
    after: str | None = None,
) -> list[str]:
    """Ids, oldest first (after the id `after`, when given), of `line`'s records whose
    message should be on its queue and has been for `quiet_s` (`_unrun_since`): those whose
    message a partial loss of Redis may have taken. Empty when nothing has waited that long
    (no queue needs reading)."""
    terms = [records.c.line == line, *_unrun_since(epoch, now=now, quiet_s=quiet_s)]
    if after is not None:
        terms.append(records.c.id > after)
    query = select(records.c.id).where(*terms).order_by(records.c.id).limit(limit)
    return list(conn.execute(query).scalars())


def claim_lost(
    conn: Connection, record_ids: Sequence[str], *, epoch: str, now: datetime, quiet_s: float
) -> list[Record]:
    """Claim, to push them again, the records of `record_ids` whose message is gone from
    Redis (the caller looked), if they are still as `waiting_suspects` found them: no
    attempt took them meanwhile. They keep `enqueued`, with no epoch until pushed.
    Returns them with `epoch`, the one they are missing from (`put_back` leaves them
    there if the push fails, for the next check)."""
    if not record_ids:
        return []
    terms = [among(conn, records.c.id, record_ids), *_unrun_since(epoch, now=now, quiet_s=quiet_s)]
    found = [
        Record.from_row(row)
        for row in conn.execute(
            update(records)
            .where(*terms)
            .values(queue_epoch=None, updated_at=db_time(now))
            .returning(*records.c)
        )
    ]
    return [dataclasses.replace(r, queue_epoch=epoch) for r in found]


def claim_as_enqueued(
    conn: Connection,
    found: Sequence[Record | RecordKey],
    event: Event,
    *,
    now: datetime,
    fresh_attempts: bool = False,
    epoch: str | None = None,
    not_in_epoch: str | None = None,
) -> list[str]:
    """`… → enqueued` by `event` (`SWEPT`, `REPLAYED`), each record guarded by the status
    it was read in and by its lease (none live), with no epoch until pushed, or with the
    `epoch` the caller is about to push them in (a record claimed but never pushed, its
    claimer killed, is found by the lost-message check either way). An expired lease is
    cleared.

    `not_in_epoch`: an `enqueued` record is claimed only if it was pushed in another
    epoch (in this one its message is on its queue or held by a worker: it is in flight).
    `fresh_attempts` (replay) starts the count of attempts again.

    Returns the ids claimed: only those may be pushed."""
    by_status: dict[RecordStatus, list[str]] = {}
    for record in found:
        by_status.setdefault(record.status, []).append(record.id)
    values: dict[str, Any] = {
        "status": RecordStatus.ENQUEUED.value,
        "queue_epoch": epoch,
        "updated_at": db_time(now),
    }
    if fresh_attempts:
        values |= {"attempts": 0, "next_attempt_at": None, "finished_at": None}
    # Only a runnable record can hold a lease (an outcome clears it): the others' lease
    # columns, and their index, are left as they are.
    cleared = values | {"lease_owner": None, "lease_expires_at": None}
    runnable = frozenset(sources(Event.ATTEMPT))
    claimed: list[str] = []
    for status, ids in by_status.items():
        terms = guard(event, status=unindexed_status, among=frozenset({status}), now=now)
        if status is RecordStatus.ENQUEUED and not_in_epoch is not None:
            terms.append(records.c.queue_epoch != not_in_epoch)
        rows = conn.execute(
            update(records)
            .where(among(conn, records.c.id, ids), *terms)
            .values(**(cleared if status.value in runnable else values))
            .returning(records.c.id)
        )
        claimed.extend(row.id for row in rows)
    return claimed


def put_back(conn: Connection, claimed: Sequence[Record], *, now: datetime) -> None:
    """Return claimed records that were not pushed to the status, epoch and lease they had
    (the undo of `claim_as_enqueued`, for a push that did not happen)."""
    groups: dict[tuple[RecordStatus, str | None, str | None, datetime | None], list[str]] = {}
    for record in claimed:
        key = (record.status, record.queue_epoch, record.lease_owner, record.lease_expires_at)
        groups.setdefault(key, []).append(record.id)
    for (status, epoch, owner, expires), ids in groups.items():
        conn.execute(
            update(records)
            .where(
                among(conn, records.c.id, ids),
                unindexed_status == RecordStatus.ENQUEUED.value,
                records.c.queue_epoch.is_(None),
            )
            .values(
                status=status.value,
                queue_epoch=epoch,
                lease_owner=owner,
                lease_expires_at=expires,
                updated_at=db_time(now),
            )
        )
