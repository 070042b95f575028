"""The journal's SQL for records: inserts, reads, moves, retention and the replay audit
(an attempt's is in `app.journal.attempts`, a push's claims in `app.journal.claims`). Every
function takes a
connection (from `Journal.transaction()` or `Journal.reading()`) and never commits: the
caller owns the transaction. Every move of a status is guarded in SQL by its rule in
`app.journal.transitions`, so a late or duplicate delivery cannot move a finished record."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    Connection,
    String,
    any_,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from app.ids import sender_of
from app.journal.dbclock import db_time
from app.journal.guards import NOW, guard
from app.journal.models import (
    UNFINISHED,
    Record,
    RecordStatus,
    Source,
    records,
    replays,
)
from app.journal.transitions import TRANSITIONS, Event


class _Unindexed(FunctionElement[str]):
    """A column SQLite must not look up through an index: rendered `+column` there (SQLite
    documents the unary plus as the way to keep a term from an index), as the column
    elsewhere. Without statistics SQLite takes `status = ?` through a status index over
    `id IN (…)` through the primary key, and reads every record of that status for each
    batch, however large the journal."""

    inherit_cache = True
    name = "unindexed"
    type = String()


@compiles(_Unindexed)
def _render_column(element: _Unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.clauses, **kw)


@compiles(_Unindexed, "sqlite")
def _render_unindexed(element: _Unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    return "+" + compiler.process(element.clauses, **kw)


@compiles(_Unindexed, "postgresql")
def _render_unindexed_pg(element: _Unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    return "(" + compiler.process(element.clauses, **kw) + " || '')"


# The status in the guard of a statement that picks its records by id, and the line it
# may name (so that the primary key picks them, however the other indexes look).
unindexed_status = _Unindexed(records.c.status)
unindexed_line = _Unindexed(records.c.line)


def among(
    conn: Connection, column: ColumnElement[Any], values: Iterable[Any]
) -> ColumnElement[bool]:
    """`column IN values`. On PostgreSQL `column = ANY(array)`: one parameter, so the
    statement's text is the same for any number of values and is prepared once, where an
    `IN` list of 1,000 ids cost more to render and parse than to run (a third of a replay)."""
    if conn.dialect.name == "postgresql":
        array = bindparam(None, list(values), type_=postgresql.ARRAY(column.type))
        return column == any_(array)
    return column.in_(list(values))


def among_param(conn: Connection, column: ColumnElement[Any], name: str) -> ColumnElement[bool]:
    """`among` with its values a parameter named `name`, for a statement built once: on
    PostgreSQL one array parameter, elsewhere an expanding `IN`."""
    if conn.dialect.name == "postgresql":
        return column == any_(bindparam(name, type_=postgresql.ARRAY(column.type)))
    return column.in_(bindparam(name, expanding=True))


@dataclass(frozen=True, kw_only=True)
class NewRecord:
    """What the intake (or a schedule) knows about a record before it is written."""

    id: str
    line: str
    business_no: str
    source: Source
    dedup_key: str
    body_sha256: str
    payload: dict[str, Any]
    # The request's W3C traceparent, when tracing is on (`app.telemetry.tracing`).
    traceparent: str | None = None


@dataclass(frozen=True, kw_only=True)
class RecordFilter:
    """Filters of `GET /v1/records`, of the operator's bulk actions and of replay.
    `ids`: the records selected by id; `error_text`: words `last_error` holds anywhere, in
    any case, as plain text (`%` and `_` match only themselves); `min_attempts`,
    `max_attempts`: bounds of `attempts`, both included."""

    ids: Sequence[str] = ()
    line: str | None = None
    statuses: Sequence[RecordStatus] = ()
    source: Source | None = None
    business_nos: Sequence[str] = ()
    since: datetime | None = None
    until: datetime | None = None
    error_text: str | None = None
    min_attempts: int | None = None
    max_attempts: int | None = None


def _upsert_dialect(conn: Connection) -> Any:
    return postgresql if conn.dialect.name == "postgresql" else sqlite


def insert_record(conn: Connection, new: NewRecord, *, now: datetime) -> tuple[Record, bool]:
    """Write `new` as `received` unless its dedup key exists.

    Returns the stored record and whether it was created by this call."""
    return insert_records(conn, [new], now=now)[0]


def insert_records(
    conn: Connection, news: Sequence[NewRecord], *, now: datetime
) -> list[tuple[Record, bool]]:
    """Write each of `news` as `received` unless its dedup key exists, in one statement.

    Returns, in order, each stored record and whether this call created it (of several
    with one dedup key, the first is created and the others get it)."""
    rows: list[dict[str, Any]] = [
        {
            "id": new.id,
            "line": new.line,
            "business_no": new.business_no,
            "source": new.source.value,
            "dedup_key": new.dedup_key,
            "body_sha256": new.body_sha256,
            "payload": new.payload,
            "status": RecordStatus.RECEIVED.value,
            "attempts": 0,
            "task_id": new.id,
            "traceparent": new.traceparent,
        }
        # In the order of their dedup keys: two processes inserting some of the same keys
        # then lock them in one order, and wait for each other instead of deadlocking.
        for new in sorted(news, key=lambda new: new.dedup_key)
    ]
    for row in rows:
        row["now"] = now
    created = {row.id for row in conn.execute(_inserts(conn), rows)}
    known = [new.dedup_key for new in news if new.id not in created]
    existing = (
        {
            row.dedup_key: Record.from_row(row)
            for row in conn.execute(select(records).where(among(conn, records.c.dedup_key, known)))
        }
        if known
        else {}
    )
    stored = []
    for new in news:
        if new.id in created:
            record = Record(
                id=new.id,
                line=new.line,
                business_no=new.business_no,
                source=new.source,
                dedup_key=new.dedup_key,
                body_sha256=new.body_sha256,
                payload=new.payload,
                status=RecordStatus.RECEIVED,
                attempts=0,
                next_attempt_at=None,
                last_error=None,
                created_at=now,
                updated_at=now,
                finished_at=None,
                task_id=new.id,
                traceparent=new.traceparent,
            )
            stored.append((record, True))
        else:
            stored.append((existing[new.dedup_key], False))
    return stored


def built_once(build: Callable[[Connection], Any]) -> Callable[[Connection], Any]:
    """`build(conn)`, a statement made once per dialect and kept: for the statements run
    most often, whose building cost more than running them. Their values are parameters."""
    made: dict[str, Any] = {}

    def statement(conn: Connection) -> Any:
        name = conn.dialect.name
        if name not in made:
            made[name] = build(conn)
        return made[name]

    return statement


@built_once
def _inserts(conn: Connection) -> Any:
    """`insert_records`' statement (the intake's every group)."""
    return (
        _upsert_dialect(conn)
        .insert(records)
        # On the database's clock, as the thresholds that compare them (`dbclock`).
        .values(created_at=db_time(NOW), updated_at=db_time(NOW))
        .on_conflict_do_nothing(index_elements=["dedup_key"])
        .returning(records.c.id)
    )


def get_record(conn: Connection, record_id: str) -> Record | None:
    row = conn.execute(select(records).where(records.c.id == record_id)).first()
    return Record.from_row(row) if row else None


def filtered(query: Any, where: RecordFilter) -> Any:
    """`query` narrowed to the records `where` selects."""
    terms = _sets(where)
    if where.since:
        terms.append(records.c.created_at >= where.since)
    if where.until:
        terms.append(records.c.created_at < where.until)
    if where.error_text:
        # Only records with an error (the partial index of them), then their words.
        terms += [
            records.c.last_error.is_not(None),
            has_words(records.c.last_error, where.error_text),
        ]
    if where.min_attempts is not None:
        terms.append(records.c.attempts >= where.min_attempts)
    if where.max_attempts is not None:
        terms.append(records.c.attempts <= where.max_attempts)
    return query.where(*terms) if terms else query


def _sets(where: RecordFilter) -> list[ColumnElement[bool]]:
    """The terms of `where` that name values a record's column is one of."""
    terms: list[ColumnElement[bool]] = []
    if where.ids:
        terms.append(records.c.id.in_(list(where.ids)))
    if where.line:
        terms.append(records.c.line == where.line)
    if where.statuses:
        terms.append(records.c.status.in_([s.value for s in where.statuses]))
    if where.source:
        terms.append(records.c.source == where.source.value)
    if where.business_nos:
        terms.append(records.c.business_no.in_(list(where.business_nos)))
    return terms


def count_records(conn: Connection, where: RecordFilter) -> int:
    """How many records match `where`."""
    query = filtered(select(func.count()).select_from(records), where)
    return int(conn.execute(query).scalar_one())


def has_words(column: ColumnElement[Any], words: str) -> ColumnElement[bool]:
    """Whether `column` holds `words` anywhere, in any case, as plain text (`%` and `_`
    match only themselves), alike on SQLite and PostgreSQL."""
    return column.icontains(words, autoescape=True)


def _by_id(query: Any, *, after: str | None, newest: bool) -> Any:
    """`query` in id order (`newest`: descending) from after the cursor `after`."""
    if after:
        query = query.where(records.c.id < after if newest else records.c.id > after)
    return query.order_by(records.c.id.desc() if newest else records.c.id)


# How many records that have an error (and match the other filters) one page of a search
# by an error's words reads at most: a page costs the same however large the journal and
# however rare the words.
ERROR_SCAN = 10_000


@dataclass(frozen=True, kw_only=True)
class RecordPage:
    """A page of records, and the cursor of the next one (None: there is no more)."""

    items: list[Record]
    next: str | None


def find_records(
    conn: Connection,
    where: RecordFilter,
    *,
    limit: int,
    after: str | None = None,
    newest: bool = False,
    scan: int = ERROR_SCAN,
) -> RecordPage:
    """A page of the records `where` selects, by id (`newest`: newest first) from after the
    cursor `after` (keyset pagination). A search by an error's words (`error_text`) reads
    at most `scan` records with an error that match the other filters, by id from `after`
    through the index of them: its page may hold fewer than `limit` records, none even,
    with a cursor to go on from (the last record it read)."""
    query = _by_id(filtered(select(records), where), after=after, newest=newest)
    bound = _walk_end(conn, where, after=after, newest=newest, scan=scan)
    if bound is not None:
        query = query.where(records.c.id >= bound if newest else records.c.id <= bound)
    found = [Record.from_row(row) for row in conn.execute(query.limit(limit + 1))]
    if len(found) > limit:
        return RecordPage(items=found[:limit], next=found[limit - 1].id)
    return RecordPage(items=found, next=bound)


def _walk_end(
    conn: Connection, where: RecordFilter, *, after: str | None, newest: bool, scan: int
) -> str | None:
    """Where a page of a search by an error's words stops: the `scan`-th record with an
    error that matches the other filters, from the cursor `after` (None: no search, or
    fewer are left, and the walk goes to the end)."""
    if not where.error_text:
        return None
    others = filtered(select(records.c.id), replace(where, error_text=None))
    walk = _by_id(others.where(records.c.last_error.is_not(None)), after=after, newest=newest)
    end: str | None = conn.execute(walk.offset(scan - 1).limit(1)).scalar()
    return end


class RecordKey(NamedTuple):
    """What replay reads of a record to pick it: no payload, no times."""

    id: str
    line: str
    business_no: str
    status: RecordStatus
    dedup_key: str

    @property
    def sender(self) -> str:
        """Who it came from (`Record.sender`)."""
        return sender_of(self.dedup_key)


_STATUSES = {status.value: status for status in RecordStatus}


def list_record_keys(
    conn: Connection, where: RecordFilter, *, limit: int, after: str | None = None
) -> list[RecordKey]:
    """The records `where` selects, by id from after the cursor `after`, reading only each
    record's `RecordKey`."""
    columns = (
        records.c.id,
        records.c.line,
        records.c.business_no,
        records.c.status,
        records.c.dedup_key,
    )
    query = _by_id(filtered(select(*columns).limit(limit), where), after=after, newest=False)
    rows = conn.execute(query)
    return [RecordKey(i, line, no, _STATUSES[status], key) for i, line, no, status, key in rows]


def payloads(conn: Connection, record_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`{record_id: payload}` of the records of `record_ids` that exist."""
    if not record_ids:
        return {}
    query = select(records.c.id, records.c.payload).where(among(conn, records.c.id, record_ids))
    return {row[0]: row[1] for row in conn.execute(query)}


def move(conn: Connection, record_ids: Iterable[str], event: Event, *, now: datetime) -> int:
    """Apply `event` to the records of `record_ids` that it may move (its sources and its
    lease rule). Returns how many moved."""
    to = TRANSITIONS[event].to
    if to is None:
        raise ValueError(f"{event.value} does not name the status it moves to")
    values = {"status": to.value, "updated_at": db_time(now)}
    return update_by_id(conn, record_ids, event, values, now=now)


def update_by_id(
    conn: Connection,
    record_ids: Iterable[str],
    event: Event,
    values: dict[str, Any],
    *,
    now: datetime,
) -> int:
    """Set `values` on the records of `record_ids` that `event` may move. Returns how
    many changed."""
    ids = list(record_ids)
    if not ids:
        return 0
    terms = guard(event, status=unindexed_status, now=now)
    result = conn.execute(
        update(records).where(among(conn, records.c.id, ids), *terms).values(**values)
    )
    return result.rowcount


def mark_synced(conn: Connection, record_ids: Sequence[str], *, now: datetime) -> int:
    """Downstream already has these records (a replay asked it): `done`, unless one is in
    flight or final. Returns how many were marked."""
    values = {
        "status": RecordStatus.DONE.value,
        "finished_at": now,
        "updated_at": db_time(now),
        "next_attempt_at": None,
        "last_error": None,
    }
    return update_by_id(conn, record_ids, Event.SYNCED, values, now=now)


def mark_enqueued(conn: Connection, record_ids: Sequence[str], *, epoch: str, now: datetime) -> int:
    """`received → enqueued` in `epoch`: the intake pushed them."""
    if not record_ids:
        return 0
    params = {"record_ids": list(record_ids), "epoch": epoch, "now": now}
    return int(conn.execute(_marks(conn), params).rowcount)


@built_once
def _marks(conn: Connection) -> Any:
    """`mark_enqueued`'s statement (the intake's every group)."""
    return (
        update(records)
        .where(
            among_param(conn, records.c.id, "record_ids"),
            *guard(Event.PUSHED, status=unindexed_status),
        )
        .values(
            status=RecordStatus.ENQUEUED.value,
            queue_epoch=bindparam("epoch"),
            updated_at=db_time(NOW),
        )
    )


def start_replay(
    conn: Connection,
    *,
    replay_id: str,
    actor: str,
    where: dict[str, Any],
    dry_run: bool,
    now: datetime,
) -> None:
    """The audit row of a replay, as it starts."""
    conn.execute(
        insert(replays).values(
            id=replay_id, actor=actor[:128], filter=where, dry_run=dry_run, started_at=now
        )
    )


def finish_replay(
    conn: Connection, *, replay_id: str, counts: dict[str, Any], now: datetime
) -> None:
    conn.execute(
        update(replays).where(replays.c.id == replay_id).values(counts=counts, finished_at=now)
    )


def counts_by_status(conn: Connection, *, line: str | None = None) -> dict[str, dict[str, int]]:
    """`{line: {status: n}}` over the whole journal (or one line)."""
    query = select(records.c.line, records.c.status, func.count()).group_by(
        records.c.line, records.c.status
    )
    if line:
        query = query.where(records.c.line == line)
    counts: dict[str, dict[str, int]] = {}
    for row_line, status, count in conn.execute(query):
        counts.setdefault(row_line, {})[status] = count
    return counts


def oldest_unfinished(conn: Connection, *, line: str) -> datetime | None:
    """Creation time of the oldest unfinished record of `line`."""
    return conn.execute(
        select(func.min(records.c.created_at)).where(
            records.c.line == line,
            records.c.status.in_([s.value for s in UNFINISHED]),
        )
    ).scalar()
