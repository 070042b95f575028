"""The attempts of records: one row per attempt, written by the attempt itself in the
transaction that records its outcome, so a record's status and its history never disagree.

An attempt whose outcome was ignored because it lost its lease (another attempt took the
record over) still writes its own row, as `lease_lost`: that row changes no record state,
and it tells an operator that the record was handed to its sink once more than its
status says. An attempt whose worker died never reports back, and leaves no row: its
number is missing from the history.

A replay or a retry never deletes rows (a replay starts the count of attempts again, so
a row has an id of its own); retention deletes them with their record. Every function
takes a connection and never commits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, func, insert, select

from app.ids import new_id
from app.journal.models import record_attempts

# How much of an error's message a row keeps.
MAX_ERROR_MESSAGE_LENGTH = 500
# How much of a downstream's answer a row keeps (characters; the sink reads at most as
# many bytes of it).
MAX_HTTP_ANSWER_LENGTH = 2048
# How much of it the list of records shows, with each record's last attempt.
MAX_LISTED_ANSWER_LENGTH = 300
# The width of the error class column.
MAX_ERROR_CLASS_LENGTH = 128
# The width of the worker host column (a lease owner's host is cut to it too).
MAX_HOST_LENGTH = 100


class Outcome(StrEnum):
    """How an attempt ended."""

    DONE = "done"
    FAILED = "failed"
    TIMEOUT = "timeout"
    LEASE_LOST = "lease_lost"


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """One attempt of a record, as the journal keeps it."""

    id: str
    record_id: str
    attempt: int
    started_at: datetime
    finished_at: datetime
    worker_host: str
    worker_pid: int
    outcome: Outcome
    http_status: int | None
    error_class: str | None
    error_message: str | None
    duration_ms: int
    # The start of the downstream's answer, for an attempt that did not end `done`.
    http_answer: str | None = None

    def public(self) -> dict[str, Any]:
        """The attempt as the API answers it (times in ISO 8601 UTC)."""
        return {
            "attempt": self.attempt,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat(),
            "worker": {"host": self.worker_host, "pid": self.worker_pid},
            "outcome": self.outcome.value,
            "http_status": self.http_status,
            "http_answer": self.http_answer,
            "error_class": self.error_class,
            "error_message": self.error_message,
            "duration_ms": self.duration_ms,
        }

    def summary(self) -> dict[str, Any]:
        """The attempt as the list of records shows it beside each record (`last_attempt`):
        the start of the answer only."""
        answer = self.http_answer
        return {
            "attempt": self.attempt,
            "outcome": self.outcome.value,
            "http_status": self.http_status,
            "http_answer": None if answer is None else answer[:MAX_LISTED_ANSWER_LENGTH],
            "finished_at": self.finished_at.isoformat(),
        }


def new_attempt(  # noqa: PLR0913 - one row's columns, keyword-only
    *,
    record_id: str,
    attempt: int,
    started_at: datetime,
    finished_at: datetime,
    worker: tuple[str, int],
    outcome: Outcome,
    http_status: int | None = None,
    http_answer: str | None = None,
    error: BaseException | None = None,
) -> Attempt:
    """The row of an attempt that ran from `started_at` to `finished_at` on `worker`
    (host, pid); `error`: what it failed with, its class and the start of its message kept;
    `http_answer`: the start of the downstream's answer, kept unless the attempt is done."""
    host, pid = worker
    elapsed_ms = int((finished_at - started_at).total_seconds() * 1000)
    return Attempt(
        id=new_id(finished_at),
        record_id=record_id,
        attempt=attempt,
        started_at=started_at,
        finished_at=finished_at,
        worker_host=host[:MAX_HOST_LENGTH],
        worker_pid=pid,
        outcome=outcome,
        http_status=http_status,
        http_answer=(
            None
            if outcome is Outcome.DONE or http_answer is None
            else http_answer[:MAX_HTTP_ANSWER_LENGTH]
        ),
        error_class=None if error is None else type(error).__name__[:MAX_ERROR_CLASS_LENGTH],
        error_message=None if error is None else str(error)[:MAX_ERROR_MESSAGE_LENGTH],
        # A wall clock may step back (NTP): a duration is never negative.
        duration_ms=max(0, elapsed_ms),
    )


def write(conn: Connection, attempts: Sequence[Attempt]) -> None:
    """Write `attempts` in `conn`'s transaction (one statement for all of them)."""
    if not attempts:
        return
    conn.execute(
        insert(record_attempts),
        [
            {
                "id": a.id,
                "record_id": a.record_id,
                "attempt": a.attempt,
                "started_at": a.started_at,
                "finished_at": a.finished_at,
                "worker_host": a.worker_host,
                "worker_pid": a.worker_pid,
                "outcome": a.outcome.value,
                "http_status": a.http_status,
                "http_answer": a.http_answer,
                "error_class": a.error_class,
                "error_message": a.error_message,
                "duration_ms": a.duration_ms,
            }
            for a in attempts
        ],
    )


def history(conn: Connection, record_id: str) -> list[Attempt]:
    """The attempts of `record_id`, oldest first."""
    query = (
        select(record_attempts)
        .where(record_attempts.c.record_id == record_id)
        .order_by(record_attempts.c.started_at, record_attempts.c.id)
    )
    return [_attempt(row) for row in conn.execute(query)]


def last_attempts(conn: Connection, record_ids: Sequence[str]) -> dict[str, Attempt]:
    """`{record_id: its last attempt}` of those of `record_ids` that have one, in one
    query (the newest row of each record through the (record_id, id) index); each answer
    cut to `MAX_LISTED_ANSWER_LENGTH`."""
    if not record_ids:
        return {}
    ids = list(record_ids)
    newest = (
        select(func.max(record_attempts.c.id))
        .where(record_attempts.c.record_id.in_(ids))
        .group_by(record_attempts.c.record_id)
    )
    columns = [c for c in record_attempts.c if c.name != "http_answer"]
    answer = func.substr(record_attempts.c.http_answer, 1, MAX_LISTED_ANSWER_LENGTH)
    query = select(*columns, answer.label("http_answer")).where(record_attempts.c.id.in_(newest))
    return {row.record_id: _attempt(row) for row in conn.execute(query)}


def _attempt(row: Any) -> Attempt:
    return Attempt(
        id=row.id,
        record_id=row.record_id,
        attempt=row.attempt,
        started_at=row.started_at,
        finished_at=row.finished_at,
        worker_host=row.worker_host,
        worker_pid=row.worker_pid,
        outcome=Outcome(row.outcome),
        http_status=row.http_status,
        http_answer=row.http_answer,
        error_class=row.error_class,
        error_message=row.error_message,
        duration_ms=row.duration_ms,
    )
