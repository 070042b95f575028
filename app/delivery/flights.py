"""What a delivery came to (a flight), recorded in the journal: done, failed (its retry
due), dead, or given back without spending an attempt (its line's circuit was open, or
it never started); and the attempt's span, which says so."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection

from app.delivery.backoff import decide
from app.delivery.circuit import Counted, State, counts_against
from app.delivery.outcomes import (
    AttemptResult,
    attempt_row,
    failure_outcome,
    log_lease_lost,
    report_dead,
    retry_after_of,
)
from app.journal import attempts
from app.journal.attempt_log import Attempt, Outcome
from app.journal.models import Record, RecordStatus
from app.lines import Line
from app.logs import get_logger
from app.observe.alerts import Alerter
from app.observe.telemetry import Counter, Telemetry
from app.observe.tracing import Span

# How long after the circuit's next probe a postponed record is due, at most (spread, so
# the records of an outage do not all come back in the same second).
POSTPONE_SPREAD = 1.0

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class Flight:
    """A claimed record's delivery as it ended: its answer's status, its error (None:
    delivered), or why it never started (`not_started`: it spends no attempt), and the
    circuit owner it probed as (empty: not a probe)."""

    record: Record
    started_at: datetime
    finished_at: datetime
    http_status: int | None = None
    error: Exception | None = None
    not_started: str | None = None
    retry_in_s: float = 0.0
    probe: str = ""
    # Whether its outcome says anything of the downstream (the circuit counts it).
    counts: bool = True
    # The attempt's span, open until its outcome is committed (`committed` is then set).
    span: Span | None = None
    committed: threading.Event | None = None


def attempt_span(record_id: str, line: Line | None) -> tuple[str, dict[str, str]]:
    """The name and attributes of an attempt's span."""
    queue = line.queue if line is not None else "unknown"
    return f"attempt {queue}", {
        "messaging.system": "redis",
        "messaging.operation.type": "process",
        "messaging.destination.name": queue,
        "pipeline.record_id": record_id,
    }


def describe_attempt(span: Span, result: AttemptResult) -> None:
    """What the attempt came to, on its span."""
    if result.record is not None:
        span.set_attribute("pipeline.attempt", result.record.attempts)
        span.set_attribute("pipeline.business_no", result.record.business_no)
    if result.outcome is not None:
        span.set_attribute("pipeline.outcome", result.outcome.value)
    if result.failed:
        span.fail(result.error or "the attempt failed")


def record_outcome(
    conn: Connection,
    flight: Flight,
    owner: str,
    line: Line,
    counted: dict[str, Counted | None],
    *,
    now: datetime,
    rng: random.Random,
) -> tuple[AttemptResult, Attempt | None]:
    """Record one delivery's outcome; its result, and its attempt's row (None: it never
    started, so it was no attempt)."""
    record = flight.record
    if flight.not_started is not None:
        retry_at = now + timedelta(seconds=flight.retry_in_s)
        attempts.give_back(
            conn, record, owner=owner, error=flight.not_started, retry_at=retry_at, now=now
        )
        return AttemptResult(record_id=record.id), None
    error: str | None = None
    if flight.error is None:
        moved = attempts.mark_done(conn, record, owner=owner, now=now)
        status = RecordStatus.DONE
        outcome = Outcome.DONE if moved else Outcome.LEASE_LOST
    else:
        error = f"{type(flight.error).__name__}: {flight.error}"
        circuit = counted.get(record.id)
        # Not before the downstream asked (a 429 or 503 with Retry-After).
        asked = timedelta(seconds=retry_after_of(flight.error) or 0.0)
        if (
            circuit is not None
            and circuit.state is State.OPEN
            and counts_against(flight.http_status)
        ):
            # The downstream is down, not the record: the attempt does not count. (A
            # refusal of the record itself, a 4xx, spends its attempt, open or not.)
            wait_s = line.settings.circuit_probe_interval_s + rng.uniform(0, POSTPONE_SPREAD)
            moved = attempts.give_back(
                conn,
                record,
                owner=owner,
                error=f"{error} (not counted: the circuit of {line.name} is open)",
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
        error=flight.error,
    )
    if not moved:
        log_lease_lost(record, outcome=status)
        return _lost(record, status.value), row
    return AttemptResult(
        record_id=record.id, record=record, status=status, outcome=outcome, error=error
    ), row


def end_spans(together: list[Flight], results: dict[str, AttemptResult]) -> None:
    """Each flight's span says what its attempt came to; its thread may end it now."""
    for flight in together:
        result = results.get(flight.record.id)
        if flight.span is not None:
            if result is not None:
                describe_attempt(flight.span, result)
            else:
                flight.span.fail("the outcome was not recorded: the journal did not answer")
        if flight.committed is not None:
            flight.committed.set()


def _lost(record: Record, outcome: str) -> AttemptResult:
    return AttemptResult(
        record_id=record.id,
        record=record,
        outcome=Outcome.LEASE_LOST,
        error=f"the outcome ({outcome}) was ignored: another attempt took the record over",
    )


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
