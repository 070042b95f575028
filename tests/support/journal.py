"""Records written straight into the journal, for tests that start past the intake."""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any

from sqlalchemy import update

from app.clock import utcnow
from app.ids import new_id
from app.journal import store
from app.journal.models import RecordStatus, Source, records
from app.journal.store import NewRecord
from app.wiring.runtime import Runtime


def journal_records(
    rt: Runtime, payloads: list[dict[str, Any]], *, line: str, status: RecordStatus
) -> list[str]:
    """A record of `line` for each payload (its `business_no` taken from it), left in
    `status`, oldest first. Returns their ids."""
    now = utcnow()
    ids = [new_id(now) for _ in payloads]
    with rt.engine.begin() as conn:
        for rid, payload in zip(ids, payloads, strict=True):
            store.insert_record(
                conn,
                NewRecord(
                    id=rid,
                    line=line,
                    business_no=payload["business_no"],
                    source=Source.INTAKE,
                    dedup_key=f"test:{rid}",
                    body_sha256="0" * 64,
                    payload=payload,
                ),
                now=now,
            )
        force_status(conn, ids, status)
    return ids


def force_status(conn: Any, record_ids: list[str], status: RecordStatus) -> None:
    """Put records in `status` whatever they were: a test's set-up, past every guard."""
    conn.execute(update(records).where(records.c.id.in_(record_ids)).values(status=status.value))


def run_records(
    rt: Runtime, record_ids: list[str], *, line: str | None = None
) -> list[RecordStatus | None]:
    """One attempt of each of `record_ids` through the attempt engine, as a message of
    `line`'s queue (default: the first record's own line) would run it: each one's new
    status, None where nothing ran."""
    if line is None:
        with rt.journal.reading() as conn:
            first = store.get_record(conn, record_ids[0])
        line = first.line if first is not None else rt.lines.names()[0]
    results = rt.attempts.run(record_ids, line=rt.lines.get(line), rng=random.Random(0))
    return [result.status for result in results]


def run_record(rt: Runtime, record_id: str, *, line: str | None = None) -> RecordStatus | None:
    """`run_records` of one record."""
    (status,) = run_records(rt, [record_id], line=line)
    return status


def backdate(conn: Any, record_ids: list[str], at: datetime) -> None:
    """Make records look written at `at` (`created_at`, `updated_at`): a test's set-up of
    old records. The journal's own writes take the database's clock on PostgreSQL, whatever
    time their caller passes."""
    conn.execute(
        update(records).where(records.c.id.in_(record_ids)).values(created_at=at, updated_at=at)
    )


def new_record(line: str, business_no: str, *, now: datetime, sender: str = "test") -> NewRecord:
    """A record of `line` as the intake would journal it, made at `now`, signed by the key
    id `sender`."""
    record_id = new_id(now)
    return NewRecord(
        id=record_id,
        line=line,
        business_no=business_no,
        source=Source.INTAKE,
        dedup_key=f"{sender}:{record_id}",
        body_sha256="0" * 64,
        payload={"business_no": business_no},
    )
