"""Journal tables, statuses and the `Record` value that crosses module boundaries."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Dialect,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    TypeDecorator,
)
from sqlalchemy.dialects.postgresql import JSONB

from app.clock import as_utc
from app.ids import sender_of


class RecordStatus(StrEnum):
    """A record's place in its life."""

    RECEIVED = "received"
    ENQUEUED = "enqueued"
    DEFERRED = "deferred"
    FAILED = "failed"
    DONE = "done"
    DEAD = "dead"
    REJECTED = "rejected"
    # An operator cancelled it before it was delivered: final, never delivered, never swept,
    # replayed only when a replay names this status.
    CANCELLED = "cancelled"


UNFINISHED = (
    RecordStatus.RECEIVED,
    RecordStatus.ENQUEUED,
    RecordStatus.DEFERRED,
    RecordStatus.FAILED,
)


class Source(StrEnum):
    """Where a record came from."""

    INTAKE = "intake"
    SCHEDULE = "schedule"
    REPLAY = "replay"


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware.

    SQLite keeps no zone, so values are normalised to UTC before they are written."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = as_utc(value)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return as_utc(value)


Json = JSON().with_variant(JSONB(), "postgresql")

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)

records = Table(
    "records",
    metadata,
    Column("id", String(26), primary_key=True),
    Column("line", String(32), nullable=False),
    Column("business_no", String(128), nullable=False),
    Column("source", String(16), nullable=False),
    Column("dedup_key", String(320), nullable=False, unique=True),
    Column("body_sha256", String(64), nullable=False),
    Column("payload", Json, nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_attempt_at", UtcDateTime, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("finished_at", UtcDateTime, nullable=True),
    Column("task_id", String(64), nullable=True),
    # The Redis epoch the record's message was pushed in (see app.admission.push): a record
    # `enqueued` in an older epoch was lost with Redis's memory and is pushed again.
    Column("queue_epoch", String(36), nullable=True),
    # The lease of the attempt running the record (app.journal.transitions): who runs it
    # (host:pid) and until when; `attempts` is its fencing token. None: nobody runs it.
    Column("lease_owner", String(128), nullable=True),
    Column("lease_expires_at", UtcDateTime, nullable=True),
    # The W3C traceparent of the request that brought the record in, when tracing is on
    # (app.telemetry.tracing): its trace id, and the span its later pushes descend from.
    Column("traceparent", String(55), nullable=True),
    Index(None, "status", "next_attempt_at"),
    Index(None, "status", "updated_at"),
    # Retention: the `done` records finished before a time, oldest first.
    Index(None, "status", "finished_at"),
    Index(None, "line", "status", "id"),
    Index(None, "business_no"),
    Index(None, "created_at"),
    # The sweeper's leases that expired without an outcome: only records in flight have one.
    Index(None, "lease_expires_at"),
)
# A search by an error's words (`app.journal.store.find_records`): only the records that
# have an error, by id, so a page walks them newest or oldest first and never the rest.
ERRORS_INDEX = "ix_records_id_with_error"
Index(
    ERRORS_INDEX,
    records.c.id,
    sqlite_where=records.c.last_error.is_not(None),
    postgresql_where=records.c.last_error.is_not(None),
)
# The Retries and Dead lists of every line (`status` failed or dead, by id, newest first):
# only the records in that status are in each, so PostgreSQL walks a list's own records in
# order however few of the journal they are, and a record in another status costs these
# nothing. (SQLite's planner, without statistics, takes the status's records from another
# index and sorts them: 27 ms for 15,000 dead records among 300,000, measured.)
TROUBLE_INDEXES = {"failed": "ix_records_failed_id", "dead": "ix_records_dead_id"}
for _status, _name in TROUBLE_INDEXES.items():
    Index(
        _name,
        records.c.id,
        sqlite_where=records.c.status == _status,
        postgresql_where=records.c.status == _status,
    )


def _keyed_sink(name: str) -> Table:
    return Table(
        name,
        metadata,
        Column("business_no", String(128), primary_key=True),
        Column("record_id", String(26), nullable=False),
        Column("payload", Json, nullable=False),
        Column("updated_at", UtcDateTime, nullable=False),
    )


# The built-in table sink: one row per business_no, upserted.
orders = _keyed_sink("orders")
refunds = _keyed_sink("refunds")
order_status = Table(
    "order_status",
    metadata,
    Column("business_no", String(128), primary_key=True),
    Column("status", String(64), nullable=False),
    Column("occurred_at", UtcDateTime, nullable=False),
    Column("record_id", String(26), nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
)
# Lines added by configuration without a handler or a downstream land here.
sink_rows = Table(
    "sink_rows",
    metadata,
    Column("line", String(32), nullable=False),
    Column("business_no", String(128), nullable=False),
    Column("record_id", String(26), nullable=False),
    Column("payload", Json, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("line", "business_no"),
)


# One row per replay: who asked, the filter, the counts (an audit trail).
replays = Table(
    "replays",
    metadata,
    Column("id", String(26), primary_key=True),
    Column("actor", String(128), nullable=False),
    Column("filter", Json, nullable=False),
    Column("dry_run", Boolean, nullable=False),
    Column("counts", Json, nullable=True),
    Column("started_at", UtcDateTime, nullable=False),
    Column("finished_at", UtcDateTime, nullable=True),
)


# Operator actions (replay, retry, cancel, pause, resume, schedule changes), newest last by
# id; retention never deletes them (`app.journal.audit`).
audit_log = Table(
    "audit_log",
    metadata,
    Column("id", String(26), primary_key=True),
    Column("at", UtcDateTime, nullable=False),
    Column("actor", String(160), nullable=False),
    Column("action", String(32), nullable=False),
    Column("target", String(256), nullable=False),
    Column("params", Json, nullable=False),
    Column("result", Json, nullable=True),
    Column("reason", Text, nullable=True),
)


# One row per attempt of a record (`app.journal.attempt_log`), written with the attempt's
# outcome; a replay or a retry keeps them, retention deletes them with their record. The
# attempt number restarts after a replay, so the row has an id of its own.
record_attempts = Table(
    "record_attempts",
    metadata,
    Column("id", String(26), primary_key=True),
    Column("record_id", String(26), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("started_at", UtcDateTime, nullable=False),
    Column("finished_at", UtcDateTime, nullable=False),
    Column("worker_host", String(100), nullable=False),
    Column("worker_pid", Integer, nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("http_status", Integer, nullable=True),
    # The start of the downstream's answer to an attempt that did not end `done` (its own
    # words for a refusal), URLs redacted; None for a done attempt.
    Column("http_answer", Text, nullable=True),
    Column("error_class", String(128), nullable=True),
    Column("error_message", Text, nullable=True),
    Column("duration_ms", Integer, nullable=False),
    # A record's attempts, in the order they were written.
    Index(None, "record_id", "id"),
)


# The lines paused by an operator: a row while the line is paused (`app.admission.pause`).
line_pauses = Table(
    "line_pauses",
    metadata,
    Column("line", String(32), primary_key=True),
    Column("paused_at", UtcDateTime, nullable=False),
    Column("actor", String(160), nullable=False),
    Column("reason", Text, nullable=True),
)


# Cron schedules; beat reads them every tick, so changes need no restart.
schedules = Table(
    "schedules",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("cron", String(128), nullable=False),
    Column("timezone", String(64), nullable=False),
    Column("line", String(32), nullable=False),
    Column("payload", Json, nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("misfire", String(16), nullable=False),
    Column("catchup_window_s", Integer, nullable=False),
    Column("last_fire_at", UtcDateTime, nullable=True),
    Column("next_fire_at", UtcDateTime, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
)


@dataclass(frozen=True, kw_only=True)
class Record:
    """One journal row, as handlers, sinks and the HTTP layer see it."""

    id: str
    line: str
    business_no: str
    source: Source
    dedup_key: str
    body_sha256: str
    payload: dict[str, Any]
    status: RecordStatus
    attempts: int
    next_attempt_at: datetime | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    task_id: str | None
    queue_epoch: str | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    traceparent: str | None = None

    @property
    def sender(self) -> str:
        """Who it came from: the intake key id it was signed with, `schedule`, `dev`."""
        return sender_of(self.dedup_key)

    @classmethod
    def from_row(cls, row: Any) -> Record:
        data = dict(row._mapping)
        data["source"] = Source(data["source"])
        data["status"] = RecordStatus(data["status"])
        return cls(**data)
