"""What an attempt came to: its row in the journal's attempts (`app.journal.attempt_log`),
and the result the worker's task reports (Flower shows it)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import httpx
from sqlalchemy import Connection

from app.errors import DeliveryFailed
from app.journal.attempt_log import Attempt, Outcome, new_attempt
from app.journal.attempts import why_not_claimed, worker_of
from app.journal.models import Record, RecordStatus
from app.logs import get_logger
from app.observe.alerts import Alerter
from app.observe.events import Event
from app.observe.telemetry import Counter, Telemetry

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class AttemptResult:
    """One record's attempt: the record as claimed (None: nothing ran: it was unknown,
    final, waiting for its retry or in flight elsewhere), its new status (None also when
    the attempt's outcome was ignored: it lost its lease), how the attempt ended, and its
    error (`Class: message`) when it failed."""

    record_id: str
    record: Record | None = None
    status: RecordStatus | None = None
    outcome: Outcome | None = None
    error: str | None = None

    @property
    def failed(self) -> bool:
        """Whether the attempt ran and did not deliver (or its outcome did not count)."""
        return self.outcome is not None and self.outcome is not Outcome.DONE


def failure_outcome(exc: BaseException) -> Outcome:
    """`timeout` for an attempt that failed waiting (the downstream did not answer in
    time, a handler's own timeout), else `failed`."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, TimeoutError | httpx.TimeoutException):
            return Outcome.TIMEOUT
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return Outcome.FAILED


def retry_after_of(exc: BaseException) -> float | None:
    """The seconds a failed delivery's downstream asked to wait (`Retry-After`), if any."""
    value = exc.details.get("retry_after_s") if isinstance(exc, DeliveryFailed) else None
    return float(value) if isinstance(value, int | float) else None


def http_status_of(exc: BaseException) -> int | None:
    """The downstream's HTTP status a failed delivery carries, if it got an answer."""
    status = exc.details.get("http_status") if isinstance(exc, DeliveryFailed) else None
    return status if isinstance(status, int) else None


def attempt_row(
    record: Record,
    *,
    owner: str,
    started_at: datetime,
    finished_at: datetime,
    outcome: Outcome,
    http_status: int | None = None,
    error: BaseException | None = None,
) -> Attempt:
    """The row of the attempt `record` was claimed for by `owner` (a lease owner)."""
    return new_attempt(
        record_id=record.id,
        attempt=record.attempts,
        started_at=started_at,
        finished_at=finished_at,
        worker=worker_of(owner),
        outcome=outcome,
        http_status=http_status,
        error=error,
    )


def log_skipped(conn: Connection, record_id: str, now: datetime) -> None:
    """Say why a message's record was not run: it is final, waiting for its retry, or in
    flight under another attempt's lease (that attempt records the outcome)."""
    log.info(
        "record_skipped",
        record_id=record_id,
        reason=why_not_claimed(conn, record_id, now=now),
    )


def log_lease_lost(record: Record, *, outcome: RecordStatus) -> None:
    """An attempt's outcome that was not recorded: its lease expired and another attempt
    took it over (that one records the outcome), or the record is final."""
    log.warning(
        "outcome_ignored_lease_lost",
        record_id=record.id,
        line=record.line,
        attempt=record.attempts,
        outcome=outcome.value,
    )


def report_dead(record: Record, error: str, *, telemetry: Telemetry, alerts: Alerter) -> None:
    """Count, log and alert (`TASK_DEAD`) a record that used up its attempts."""
    telemetry.count(Counter.DEAD, line=record.line)
    log.error("record_dead", record_id=record.id, line=record.line, attempts=record.attempts)
    alerts.raise_event(
        Event.TASK_DEAD,
        line=record.line,
        message=f"record {record.id} ({record.business_no}) is dead after "
        f"{record.attempts} attempts",
        record_id=record.id,
        business_no=record.business_no,
        attempts=record.attempts,
        error=error[:500],
    )
