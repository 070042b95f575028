"""What an attempt came to, and the one place that decides it: done, failed (its retry
due, after the line's backoff), dead, or given back without spending an attempt (it failed
while its line's circuit was open); its row in the journal's attempts
(`app.journal.attempt_log`), its span, what a record that waits without spending an
attempt waits for, and the result the worker's task reports (Flower shows it). (The
table sink's delivered records are marked done by the statement that claims them, in the
same transaction: they need no decision.)"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from opentelemetry.trace import Span, StatusCode
from sqlalchemy import Connection

from app.config.line_settings import LineSettings
from app.delivery.circuit import counts_against
from app.errors import DeliveryFailed
from app.journal import attempts
from app.journal.attempt_log import Attempt, Outcome, new_attempt
from app.journal.attempts import why_not_claimed, worker_of
from app.journal.models import Record, RecordStatus
from app.lines import Line
from app.telemetry.alerts import Alerter
from app.telemetry.counters import Counter, Telemetry
from app.telemetry.events import Event
from app.telemetry.logs import get_logger

log = get_logger(__name__)

# How long after the circuit's next probe a postponed record is due, at most (spread, so
# the records of an outage do not all come back in the same second).
POSTPONE_SPREAD = 1.0

# How a record that waits without spending an attempt says why, in its `last_error`: not
# attempted (`NOT_ATTEMPTED` and the reason), or attempted while its line's circuit was
# open (the error, then `NOT_COUNTED`).
NOT_ATTEMPTED = "not attempted: "
NOT_COUNTED = "(not counted: "


class WaitingFor(StrEnum):
    """What a `failed` record that spent no attempt waits for."""

    DOWNSTREAM = "downstream"  # its line's circuit is open, or its downstream asked to wait
    ROOM = "room"  # no delivery slot, or no room under its line's limits, in time


def circuit_open(line: str) -> str:
    return f"the circuit of {line} is open (its downstream fails most deliveries)"


def asked_to_wait(line: str) -> str:
    return f"{line}'s downstream asked to wait (Retry-After)"


def ramping(line: str) -> str:
    return f"the circuit of {line} closed moments ago: its deliveries come back on a ramp"


def waiting_for(record: Record, *, circuit_open: bool = False) -> WaitingFor | None:
    """What `record` waits for, when it is `failed` without its attempt spent, or while
    its line's circuit is `circuit_open` (its retry waits for the downstream then,
    whatever failed its last attempt). None: it is not, or its last attempt failed for its
    own sake."""
    error = record.last_error or ""
    if record.status is not RecordStatus.FAILED:
        return None
    if circuit_open:
        return WaitingFor.DOWNSTREAM
    if NOT_COUNTED in error:
        return WaitingFor.DOWNSTREAM
    if not error.startswith(NOT_ATTEMPTED):
        return None
    if "circuit of" in error or "asked to wait" in error:
        return WaitingFor.DOWNSTREAM
    return WaitingFor.ROOM


@dataclass(frozen=True, kw_only=True)
class Decision:
    """After a failed attempt: retry at `retry_at`, or give up (`retry_at` is None)."""

    retry_at: datetime | None

    @property
    def dead(self) -> bool:
        return self.retry_at is None


def backoff_s(attempts: int, *, initial_s: float, max_s: float, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(max_s, initial_s * 2^(attempts-1))]."""
    ceiling = min(max_s, initial_s * 2 ** max(attempts - 1, 0))
    return rng.uniform(0, ceiling)


def decide(attempts: int, *, policy: LineSettings, now: datetime, rng: random.Random) -> Decision:
    """What to do after attempt number `attempts` (the first is 1) failed."""
    if attempts >= policy.max_attempts:
        return Decision(retry_at=None)
    delay_s = backoff_s(
        attempts, initial_s=policy.backoff_initial_s, max_s=policy.backoff_max_s, rng=rng
    )
    return Decision(retry_at=now + timedelta(seconds=delay_s))


@dataclass(kw_only=True)
class Flight:
    """A claimed record's attempt as it ended: its answer's status, its error (None:
    delivered), the circuit owner it probed as (empty: not a probe), and whether the
    circuit was open when it ended (its failure then spends no attempt)."""

    record: Record
    started_at: datetime
    finished_at: datetime
    http_status: int | None = None
    # The start of the downstream's answer to a refusal (`http_answer_of`).
    http_answer: str | None = None
    error: Exception | None = None
    probe: str = ""
    # Whether its outcome says anything of the downstream (the circuit counts it).
    counts: bool = True
    circuit_open: bool = False


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
        if isinstance(current, TimeoutError):
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


def http_answer_of(exc: BaseException) -> str | None:
    """The start of the downstream's answer a failed delivery carries, if it got one."""
    answer = exc.details.get("http_answer") if isinstance(exc, DeliveryFailed) else None
    return answer if isinstance(answer, str) else None


def attempt_row(  # noqa: PLR0913 - one row's values, keyword-only
    record: Record,
    *,
    owner: str,
    started_at: datetime,
    finished_at: datetime,
    outcome: Outcome,
    http_status: int | None = None,
    http_answer: str | None = None,
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
        http_answer=http_answer,
        error=error,
    )


def record_outcome(
    conn: Connection, flight: Flight, owner: str, line: Line, *, now: datetime, rng: random.Random
) -> tuple[AttemptResult, Attempt]:
    """Record one attempt's outcome, while its lease is held: its result, and its attempt's
    row. The one place that decides done, failed (and when it is due again) or dead."""
    record = flight.record
    error: str | None = None
    if flight.error is None:
        moved = attempts.mark_done(conn, record, owner=owner, now=now)
        status = RecordStatus.DONE
        outcome = Outcome.DONE if moved else Outcome.LEASE_LOST
    else:
        error = f"{type(flight.error).__name__}: {flight.error}"
        # Not before the downstream asked (a 429 or 503 with Retry-After).
        asked = timedelta(seconds=retry_after_of(flight.error) or 0.0)
        if flight.circuit_open and counts_against(flight.http_status):
            # The downstream is down, not the record: the attempt does not count. (A
            # refusal of the record itself, a 4xx, spends its attempt, open or not.)
            wait_s = line.settings.circuit_probe_interval_s + rng.uniform(0, POSTPONE_SPREAD)
            moved = attempts.give_back(
                conn,
                record,
                owner=owner,
                error=f"{error} {NOT_COUNTED}the circuit of {line.name} is open)",
                retry_at=now + max(timedelta(seconds=wait_s), asked),
                now=now,
            )
            status = RecordStatus.FAILED
        else:
            decision = decide(record.attempts, policy=line.settings, now=now, rng=rng)
            next_at = None if decision.dead else max(decision.retry_at or now, now + asked)
            moved = attempts.mark_failed(
                conn, record, owner=owner, error=error, retry_at=next_at, now=now
            )
            status = RecordStatus.DEAD if decision.dead else RecordStatus.FAILED
        outcome = failure_outcome(flight.error) if moved else Outcome.LEASE_LOST
    row = attempt_row(
        record,
        owner=owner,
        started_at=flight.started_at,
        finished_at=flight.finished_at,
        outcome=outcome,
        http_status=flight.http_status,
        # Kept for an attempt that did not end done (`new_attempt` leaves it out then).
        http_answer=flight.http_answer,
        error=flight.error,
    )
    if not moved:
        log_lease_lost(record, outcome=status)
        return AttemptResult(
            record_id=record.id,
            record=record,
            outcome=Outcome.LEASE_LOST,
            error=f"the outcome ({status.value}) was ignored: another attempt took the record over",
        ), row
    return AttemptResult(
        record_id=record.id, record=record, status=status, outcome=outcome, error=error
    ), row


def report(result: AttemptResult, line: Line, *, telemetry: Telemetry, alerts: Alerter) -> None:
    """Count and log what an attempt came to (and alert a dead record)."""
    record = result.record
    if record is None or result.outcome is None:
        return
    if result.status is RecordStatus.DONE:
        telemetry.count(Counter.DONE, line=line.name)
        log.info("record_done", record_id=record.id, line=line.name, attempts=record.attempts)
    elif result.status is RecordStatus.DEAD:
        report_dead(record, result.error or "", telemetry=telemetry, alerts=alerts)
    elif result.status is RecordStatus.FAILED:
        telemetry.count(Counter.FAILED, line=line.name)
        log.warning(
            "attempt_failed",
            record_id=record.id,
            line=line.name,
            attempts=record.attempts,
            error=result.error,
        )


def attempt_span(record_id: str, line: Line | None) -> tuple[str, dict[str, str]]:
    """The name and attributes of an attempt's span."""
    queue = line.queue if line is not None else "unknown"
    return f"attempt {queue}", {
        "messaging.system": "redis",
        "messaging.operation.type": "process",
        "messaging.destination.name": queue,
        "pipeline.record_id": record_id,
    }


def describe_attempt(span: Span, result: AttemptResult | None) -> None:
    """What the attempt came to, on its span (None: its outcome was not recorded)."""
    if result is None:
        span.set_status(
            StatusCode.ERROR, "the outcome was not recorded: the journal did not answer"
        )
        return
    if result.record is not None:
        span.set_attribute("pipeline.attempt", result.record.attempts)
        span.set_attribute("pipeline.business_no", result.record.business_no)
    if result.outcome is not None:
        span.set_attribute("pipeline.outcome", result.outcome.value)
    if result.failed:
        span.set_status(StatusCode.ERROR, result.error or "the attempt failed")


def log_skipped(conn: Connection, record_id: str, now: datetime) -> str | None:
    """Say why a message's record was not claimed: it is unknown, final, waiting for its
    retry, in flight under another attempt's lease (that attempt records the outcome), or
    of another line than the message's. Returns its line (None: unknown)."""
    reason, line = why_not_claimed(conn, record_id, now=now)
    log.info("record_skipped", record_id=record_id, reason=reason, line=line)
    return line


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


# Where a delivery's error quotes its downstream's answer: after `HTTP <status>` (and its
# Retry-After), `: <the answer's start>` (`sinks.quoted`).
_ANSWER_QUOTED = re.compile(r"(: HTTP \d{3}(?:, Retry-After [^:]*)?): .*\Z", re.DOTALL)


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
        # The error without the downstream's own words: they may carry its customers' data,
        # and the alert goes to a chat; the record's attempts keep them.
        error=_ANSWER_QUOTED.sub(r"\1", error)[:500],
    )
