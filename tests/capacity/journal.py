"""Capacity: what the journal's records and attempts take on disk, measured.

Records with realistic payloads are written and taken through their life by the journal's
own functions (insert, `enqueued`, the attempt's lease, `done`, the attempt's row), each
step its own transaction as in production; then the size of each table and each index is
read from the database itself: PostgreSQL's `pg_relation_size` family, SQLite's `dbstat`."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from app.errors import DeliveryFailed
from app.ids import digest, new_id
from app.journal import attempt_log, attempts, store
from app.journal.engine import make_engine
from app.journal.journal import Journal
from app.journal.models import Record, Source
from app.journal.schema import upgrade

# Records per transaction while the journal is filled (the intake's group commit writes
# up to a few hundred; bigger batches only make the fill faster, not the rows smaller).
BATCH = 1000
# One record in this many has a failed attempt before its delivery.
FAILED_EVERY = 10
# The journal's tables whose size grows with the records.
TABLES = ("records", "record_attempts")
# PostgreSQL's default `autovacuum_vacuum_scale_factor`: a table is vacuumed once its dead
# rows pass this share of its rows. The fill vacuums as often (SQLite reuses a page's free
# room without it).
AUTOVACUUM_SCALE_FACTOR = 0.2
# Records the intake's group commit writes together at a few hundred requests a second
# (one commit of a few milliseconds gathers 2 to 4); each group has its own time.
GROUP = 4
# Between two records at 10 million a day.
SPACING = timedelta(days=1) / 10_000_000
# From the commit to the push, and a delivery's length.
PUSH = timedelta(milliseconds=2)
ATTEMPT = timedelta(milliseconds=45)
# One Redis epoch (a UUID, as `app.admission.push` makes them).
EPOCH = "5f0c3f2e-8a47-4b53-9d1e-7c2a0b6e4d19"
# A lease as long as the default visibility timeout.
LEASE_S = 120.0
# What a failed attempt of the HTTP sink keeps, as `app.delivery.sinks` words it.
FAILED_ERROR = DeliveryFailed("POST http://orders.internal:8080/v1/orders: HTTP 503")

_PG_SIZES = text(
    "SELECT c.relname, c.relkind, pg_relation_size(c.oid), pg_total_relation_size(c.oid), "
    "COALESCE(t.relname, c.relname) "
    "FROM pg_class c LEFT JOIN pg_index i ON i.indexrelid = c.oid "
    "LEFT JOIN pg_class t ON t.oid = i.indrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'i') "
    "AND COALESCE(t.relname, c.relname) IN ('records', 'record_attempts')"
)
_SQLITE_SIZES = text(
    "SELECT d.name, m.type, SUM(d.pgsize), m.tbl_name FROM dbstat d "
    "JOIN sqlite_schema m ON m.name = d.name "
    "WHERE m.tbl_name IN ('records', 'record_attempts') GROUP BY d.name"
)


def order_payload(n: int) -> dict[str, Any]:
    """An order as a shop would push it: a customer, two items, an address (~400 bytes)."""
    return {
        "business_no": f"ORD-2026-{n:08d}",
        "customer": {
            "id": f"C-{n % 100_000:06d}",
            "name": "Erika Mustermann",
            "email": f"customer{n % 100_000}@example.com",
        },
        "amount": f"{(n % 50_000) / 100 + 10:.2f}",
        "currency": "EUR",
        "items": [
            {"sku": f"SKU-{n % 9_973:05d}", "qty": 1 + n % 3, "price": "39.95"},
            {"sku": f"SKU-{n % 7_919:05d}", "qty": 1, "price": "50.00"},
        ],
        "shipping": {
            "street": f"Hauptstrasse {n % 200 + 1}",
            "city": "Berlin",
            "postcode": "10115",
            "country": "DE",
        },
        "placed_at": "2026-12-03T10:15:00Z",
    }


@contextmanager
def scratch_database(url: str, workdir: Any) -> Iterator[str]:
    """A new, migrated journal: a SQLite file in `workdir` (`url` "sqlite"), or on the
    PostgreSQL server of `url` (any database there the user may connect to) a database of
    its own, dropped afterwards."""
    if url == "sqlite":
        scratch = f"sqlite:///{workdir}/capacity-{uuid.uuid4().hex[:12]}.db"
    else:
        name = f"pipeline_capacity_{uuid.uuid4().hex[:12]}"
        admin = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        # A database's name cannot be a bound parameter: the dialect quotes it.
        quoted = admin.dialect.identifier_preparer.quote_identifier(name)
        with admin.connect() as conn:
            conn.execute(text(" ".join(["CREATE DATABASE", quoted])))
        scratch = make_url(url).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(scratch)
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    try:
        yield scratch
    finally:
        if url != "sqlite":
            with admin.connect() as conn:
                conn.execute(text(" ".join(["DROP DATABASE IF EXISTS", quoted, "WITH (FORCE)"])))
            admin.dispose()


def relation_sizes(conn: Connection) -> dict[str, dict[str, Any]]:
    """`{name: {kind: table|index, table, bytes}}` of the records' and attempts' tables and
    their indexes; on PostgreSQL a table's `bytes` is its heap, `total_bytes` adds its
    indexes and TOAST."""
    sizes: dict[str, dict[str, Any]] = {}
    if conn.dialect.name == "postgresql":
        for name, kind, size, total, table in conn.execute(_PG_SIZES):
            entry = {"kind": "table" if kind == "r" else "index", "table": table, "bytes": size}
            if kind == "r":
                entry["total_bytes"] = total
            sizes[name] = entry
    else:
        for name, kind, size, table in conn.execute(_SQLITE_SIZES):
            # A WITHOUT ROWID table or an automatic index (the primary key of a text id,
            # the unique dedup key) is listed under its own name.
            sizes[name] = {"kind": kind, "table": table, "bytes": int(size)}
    return sizes


def _vacuum(engine: Engine, *, full: bool) -> None:
    """PostgreSQL: VACUUM (ANALYZE), or VACUUM FULL (the tables rewritten compact); SQLite:
    a checkpoint of its WAL into the file, or VACUUM."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if engine.dialect.name != "postgresql":
            conn.execute(text("VACUUM" if full else "PRAGMA wal_checkpoint(TRUNCATE)"))
        elif full:
            conn.execute(text("VACUUM (FULL, ANALYZE) records, record_attempts"))
        else:
            conn.execute(text("VACUUM (ANALYZE) records, record_attempts"))


def new_record(n: int, at: datetime) -> store.NewRecord:
    payload = order_payload(n)
    return store.NewRecord(
        id=new_id(at),
        line="order",
        business_no=payload["business_no"],
        source=Source.INTAKE,
        dedup_key=f"shop-eu:{uuid.uuid4().hex}",
        body_sha256=digest(json.dumps(payload).encode()),
        payload=payload,
    )


def _attempt_rows(
    claimed: list[Record], *, worker: tuple[str, int], started: datetime
) -> list[attempt_log.Attempt]:
    """A `done` attempt of each of `claimed`, after a failed one for each tenth."""
    rows = []
    for record in claimed:
        if int(record.business_no.rsplit("-", 1)[1]) % FAILED_EVERY == 0:
            earlier = started - timedelta(seconds=2)
            rows.append(
                attempt_log.new_attempt(
                    record_id=record.id,
                    attempt=record.attempts - 1,
                    started_at=earlier,
                    finished_at=earlier + ATTEMPT,
                    worker=worker,
                    outcome=attempt_log.Outcome.FAILED,
                    http_status=503,
                    error=FAILED_ERROR,
                )
            )
        rows.append(
            attempt_log.new_attempt(
                record_id=record.id,
                attempt=record.attempts,
                started_at=started,
                finished_at=started + ATTEMPT,
                worker=worker,
                outcome=attempt_log.Outcome.DONE,
                http_status=200,
            )
        )
    return rows


def _life(journal: Journal, n0: int, count: int, start: datetime) -> int:
    """Records n0 … n0+count-1 taken from the intake to `done`, one transaction per step
    (each step runs group by group, `GROUP` records a group, every group at its own time,
    `SPACING` after the one before). Returns the payload bytes written (as JSON)."""
    groups = []
    for g0 in range(n0, n0 + count, GROUP):
        at = start + SPACING * g0
        groups.append((at, [new_record(n, at) for n in range(g0, min(n0 + count, g0 + GROUP))]))
    with journal.transaction() as conn:
        for at, news in groups:
            store.insert_records(conn, news, now=at)
    with journal.transaction() as conn:
        for at, news in groups:
            ids = [new.id for new in news]
            store.mark_enqueued(conn, ids, epoch=EPOCH, now=at + PUSH)
    owner = attempts.new_owner()
    claims = []
    with journal.transaction() as conn:
        for at, news in groups:
            ids = [new.id for new in news]
            claims.append(
                (at, attempts.claim_attempts(conn, ids, owner=owner, lease_s=LEASE_S, now=at))
            )
    with journal.transaction() as conn:
        for at, claimed in claims:
            started = at + PUSH * 2
            attempts.mark_done_all(conn, claimed, owner=owner, now=started + ATTEMPT)
            rows = _attempt_rows(claimed, worker=attempts.worker_of(owner), started=started)
            attempt_log.write(conn, rows)
    return sum(len(json.dumps(new.payload)) for _at, news in groups for new in news)


def measure_journal(url: str, *, records: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """Write `records` records through their life on the (scratch) journal at `url`, one
    failed attempt for each tenth; the sizes of their tables and indexes as they lived
    (`lived`: on PostgreSQL vacuumed whenever autovacuum's default would have, and once
    at the end; on SQLite its WAL checkpointed) and compacted (`compact`: PostgreSQL's
    VACUUM FULL, SQLite's VACUUM)."""
    engine = make_engine(url)
    journal = Journal(engine)
    try:
        start = datetime.now(UTC) - SPACING * records
        payload_bytes = 0
        vacuumed_at = 0
        for n0 in range(0, records, BATCH):
            payload_bytes += _life(journal, n0, min(BATCH, records - n0), start)
            written = min(records, n0 + BATCH)
            pg = engine.dialect.name == "postgresql"
            if pg and written - vacuumed_at > AUTOVACUUM_SCALE_FACTOR * written:
                # As autovacuum would: the dead versions' room is reused by later rows.
                _vacuum(engine, full=False)
                vacuumed_at = written
            if n0 and n0 % (BATCH * 20) == 0:
                progress(f"journal: {n0:,} of {records:,} records written")
    finally:
        # The journal's engine keeps a checkpointing thread on SQLite; the sizes are read
        # on a plain connection once it is gone.
        engine.dispose()
    plain = create_engine(url, poolclass=NullPool)
    try:
        with plain.connect() as conn:
            attempt_rows = conn.execute(text("SELECT count(*) FROM record_attempts")).scalar_one()
        _vacuum(plain, full=False)
        with plain.connect() as conn:
            lived = relation_sizes(conn)
        _vacuum(plain, full=True)
        with plain.connect() as conn:
            compact = relation_sizes(conn)
    finally:
        plain.dispose()
    return {
        "database": plain.dialect.name,
        "records": records,
        "attempts": int(attempt_rows),
        "payload_json_bytes_mean": round(payload_bytes / records, 1),
        "lived": lived,
        "compact": compact,
    }
