"""The HTTP sink's deliveries of a message, many in flight at once within one worker
process.

The records of a message are claimed in one transaction (each its own lease and attempt
number), then each is delivered on a thread of the process's pool: it asks its line's
circuit (`app.delivery.circuit`) and global limits (`app.delivery.limits`) first, then
POSTs over the process's one HTTP client (keep-alive). Outcomes are recorded as they come,
those that came together in one transaction, so a slow record holds no other's outcome.

A delivery the circuit or the limits keep from starting spends no attempt: its record is
given back (`failed`, due again soon, its attempt number returned). So is a failure while
the circuit is open: an outage alone never makes a record `dead`."""

from __future__ import annotations

import contextlib
import queue
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import Connection

from app.delivery.backoff import decide
from app.delivery.circuit import Admission, Change, Circuits, Counted, State, counts_against
from app.delivery.limits import DeliveryLimits
from app.delivery.outcomes import (
    AttemptResult,
    attempt_row,
    failure_outcome,
    http_status_of,
    log_lease_lost,
    log_skipped,
    report_dead,
)
from app.delivery.sinks import deliver_http
from app.errors import BrokerUnavailable
from app.journal import attempt_log, attempts
from app.journal.attempt_log import Attempt, Outcome
from app.journal.journal import Journal
from app.journal.models import Record, RecordStatus
from app.lines import Line
from app.logs import get_logger
from app.observe.alerts import Alerter
from app.observe.events import Event
from app.observe.telemetry import Counter, Telemetry
from app.observe.tracing import Span, SpanKind, Tracing

log = get_logger(__name__)

# The longest a claimed record waits for its line's limits before it is given back
# (a quarter of its lease at most, so the message ends well within its time limit).
MAX_LIMIT_WAIT_S = 30.0
# How long a delivery thread keeps its attempt's span open waiting for the outcome's
# commit (the journal's own timeout ends a commit well within it).
COMMIT_WAIT_S = 60.0
# How long after the circuit's next probe a postponed record is due, at most (spread, so
# the records of an outage do not all come back in the same second).
POSTPONE_SPREAD = 1.0


@dataclass(frozen=True, kw_only=True)
class _Flight:
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


@dataclass(frozen=True, kw_only=True)
class _Message:
    """The context of one message's deliveries: its line, the lease owner of its
    attempts, its records' traceparents, the clock and the backoff's jitter."""

    line: Line
    owner: str
    parents: dict[str, str]
    clock: Callable[[], datetime]
    rng: random.Random


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


class ConcurrentDeliveries:
    """Runs the HTTP sink's attempts of a message's records concurrently."""

    def __init__(  # noqa: PLR0913 - the pieces it is built on, keyword-only
        self,
        *,
        journal: Journal,
        http: httpx.Client,
        telemetry: Telemetry,
        alerts: Alerter,
        limits: DeliveryLimits,
        circuits: Circuits,
        tracing: Tracing,
        lease_s: float,
    ) -> None:
        self._journal = journal
        self._http = http
        self._telemetry = telemetry
        self._alerts = alerts
        self._limits = limits
        self._circuits = circuits
        self._tracing = tracing
        self._lease_s = lease_s
        self._pool: ThreadPoolExecutor | None = None
        self._threads = 0

    def _executor(self, threads: int) -> ThreadPoolExecutor:
        """The process's delivery threads, as many as the most any line asked for."""
        if self._pool is None or threads > self._threads:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="delivery")
            self._threads = threads
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def run(
        self,
        record_ids: list[str],
        *,
        line: Line,
        parents: dict[str, str],
        clock: Callable[[], datetime],
        rng: random.Random,
    ) -> list[AttemptResult]:
        """One attempt of each of `record_ids` (records of `line`, an HTTP-sink line),
        delivered concurrently. Returns each one's result, in the order given. Raises
        `JournalUnavailable` when the claim cannot be made, or an outcome not recorded
        (the leases then lapse and the sweeper pushes the records again)."""
        ids = list(dict.fromkeys(record_ids))
        message = _Message(
            line=line, owner=attempts.new_owner(), parents=parents, clock=clock, rng=rng
        )
        # What does not run has nothing to say; the others' results replace theirs.
        results = {record_id: AttemptResult(record_id=record_id) for record_id in ids}
        to_run, probe = self._admitted(ids, message)
        claimed = self._claim(to_run, message)
        if probe and ids[0] not in {record.id for record in claimed}:
            self._circuits.drop_probe(line.name, probe)
        pool = self._executor(line.settings.delivery_threads)
        landed: queue.Queue[_Flight] = queue.Queue()
        for record in claimed:
            pool.submit(
                self._deliver_to, landed, record, message, probe if record.id == ids[0] else ""
            )
        self._collect(landed, len(claimed), message, results)
        return [results[record_id] for record_id in ids]

    def _claim(self, to_run: list[str], message: _Message) -> list[Record]:
        """Claim an attempt of each of `to_run`, in one transaction; say why of the others."""
        if not to_run:
            return []
        now = message.clock()
        with self._journal.transaction(f"claim of {len(to_run)} deliveries") as conn:
            claimed = attempts.claim_attempts(
                conn, to_run, owner=message.owner, lease_s=self._lease_s, now=now
            )
            found = {record.id for record in claimed}
            for record_id in to_run:
                if record_id not in found:
                    log_skipped(conn, record_id, now)
        return claimed

    def _collect(
        self,
        landed: queue.Queue[_Flight],
        count: int,
        message: _Message,
        results: dict[str, AttemptResult],
    ) -> None:
        """Record the outcomes of `count` deliveries as they land, those that landed
        together in one transaction. Raises the first failure to record, once every
        delivery has landed."""
        pending_error: Exception | None = None
        remaining = count
        while remaining:
            together = [landed.get()]
            while True:
                try:
                    together.append(landed.get_nowait())
                except queue.Empty:
                    break
            remaining -= len(together)
            try:
                for result in self._record(together, message):
                    results[result.record_id] = result
            except Exception as exc:  # noqa: BLE001 - the others' outcomes come first
                pending_error = pending_error or exc
            finally:
                _end_spans(together, results)
        if pending_error is not None:
            raise pending_error

    def _admitted(self, ids: list[str], message: _Message) -> tuple[list[str], str]:
        """The records of `ids` to claim now, and the circuit's probe owner if the first is
        its probe. With the line's circuit open, the others wait as `failed` (postponed,
        no attempt spent) until about the next probe."""
        line, owner, clock = message.line, message.owner, message.clock
        try:
            if self._circuits.state(line.name).state is State.CLOSED:
                return ids, ""
            probe = f"{owner}:{ids[0]}"
            verdict = self._circuits.admit(
                line.name, owner=probe, probe_lifetime_s=self._longest_delivery_s(line)
            )
        except BrokerUnavailable as exc:
            log.warning("circuit_unread", line=line.name, error=str(exc))
            return ids, ""
        if verdict.admission is Admission.GO:
            return ids, ""
        first = 1 if verdict.admission is Admission.PROBE else 0
        waiting = ids[first:]
        if waiting:
            now = clock()
            retry_at = now + timedelta(seconds=max(verdict.wait_s, 0.1) + POSTPONE_SPREAD)
            with self._journal.transaction(f"postponing {len(waiting)} deliveries") as conn:
                moved = attempts.postpone(
                    conn,
                    waiting,
                    reason=f"not attempted: the circuit of {line.name} is open "
                    "(its downstream fails most deliveries)",
                    retry_at=retry_at,
                    now=now,
                )
            log.info("deliveries_postponed_circuit_open", line=line.name, postponed=moved)
        return ids[:first], (probe if first else "")

    def _longest_delivery_s(self, line: Line) -> float:
        """The longest one delivery may take: its limits' wait, then its request's phases
        (connect, send, read)."""
        return self._limit_wait_s() + 3 * line.settings.delivery_timeout_s + 1

    def _limit_wait_s(self) -> float:
        return min(MAX_LIMIT_WAIT_S, self._lease_s / 4)

    def _deliver_to(
        self, landed: queue.Queue[_Flight], record: Record, message: _Message, probe: str
    ) -> None:
        """On a delivery thread: `_deliver`, its flight handed to `landed` whatever
        happens. The attempt's span (current while the request goes out, so the request's
        own span is its child) ends once the outcome is committed, with what it came to."""
        began = datetime.now(UTC)
        with contextlib.ExitStack() as span_scope:
            try:
                flight = self._deliver(record, message, probe, span_scope)
            except BaseException as exc:
                landed.put(
                    _Flight(
                        record=record,
                        started_at=began,
                        finished_at=datetime.now(UTC),
                        error=exc if isinstance(exc, Exception) else RuntimeError(repr(exc)),
                    )
                )
                raise
            landed.put(flight)
            if flight.committed is not None:
                flight.committed.wait(timeout=COMMIT_WAIT_S)

    def _deliver(
        self, record: Record, message: _Message, probe: str, span_scope: contextlib.ExitStack
    ) -> _Flight:
        """On a delivery thread: wait for the circuit and the limits, then POST."""
        line, clock, rng = message.line, message.clock, message.rng
        parent = message.parents.get(record.id)
        started = clock()
        if record.attempts > line.settings.max_attempts:
            # Attempts that never reported back: each one killed its worker process.
            return _Flight(
                record=record,
                started_at=started,
                finished_at=clock(),
                error=RuntimeError("the worker was lost on every attempt"),
                counts=False,
            )
        if not probe:
            probe, wait_s = self._ask_circuit(f"{message.owner}:{record.id}", line)
            if wait_s:
                return _Flight(
                    record=record,
                    started_at=started,
                    finished_at=clock(),
                    not_started=f"not attempted: the circuit of {line.name} is open",
                    retry_in_s=wait_s + rng.uniform(0, POSTPONE_SPREAD),
                )
        slot, waited = self._wait_for_limits(line)
        if waited is not None:
            if probe:
                self._circuits.drop_probe(line.name, probe)
            return _Flight(
                record=record,
                started_at=started,
                finished_at=clock(),
                not_started=f"not attempted: no room under {line.name}'s delivery limits "
                f"within {waited:.0f} s",
                retry_in_s=rng.uniform(1, 1 + POSTPONE_SPREAD),
            )
        name, attributes = attempt_span(record.id, line)
        span = span_scope.enter_context(
            self._tracing.span(name, kind=SpanKind.CONSUMER, parent=parent, attributes=attributes)
        )
        committed = threading.Event() if self._tracing.enabled else None
        started = clock()
        try:
            status = deliver_http(
                self._http,
                record,
                url=line.settings.downstream_url or "",
                delivered=line.settings.delivered,
                timeout_s=line.settings.delivery_timeout_s,
            )
        except Exception as exc:  # noqa: BLE001 - any failure is the attempt's
            return _Flight(
                record=record,
                started_at=started,
                finished_at=clock(),
                http_status=http_status_of(exc),
                error=exc,
                probe=probe,
                span=span,
                committed=committed,
            )
        finally:
            self._limits.release(line.name, slot)
        return _Flight(
            record=record,
            started_at=started,
            finished_at=clock(),
            http_status=status,
            probe=probe,
            span=span,
            committed=committed,
        )

    def _ask_circuit(self, owner: str, line: Line) -> tuple[str, float]:
        """(`owner`, 0) when this delivery is the circuit's probe, ("", 0) when it may go,
        ("", s) when it must wait about `s` seconds. Redis not answering: it goes."""
        try:
            verdict = self._circuits.admit(
                line.name, owner=owner, probe_lifetime_s=self._longest_delivery_s(line)
            )
        except BrokerUnavailable:
            return "", 0.0
        if verdict.admission is Admission.WAIT:
            return "", max(verdict.wait_s, 0.1)
        return (owner if verdict.admission is Admission.PROBE else ""), 0.0

    def _wait_for_limits(self, line: Line) -> tuple[str | None, float | None]:
        """Wait for a slot and a token of `line`'s global limits: (the slot, None), or
        (None, seconds waited) when none came within the wait's budget. Redis not
        answering: the delivery goes (the limits cannot be kept, the records can)."""
        settings = line.settings
        if settings.delivery_rate is None and settings.delivery_concurrency is None:
            return None, None
        budget = self._limit_wait_s()
        began = time.monotonic()
        lifetime = 3 * settings.delivery_timeout_s + 1
        while True:
            try:
                grant = self._limits.ask(line.name, settings, lifetime_s=lifetime)
            except BrokerUnavailable as exc:
                log.warning("delivery_limits_unread", line=line.name, error=str(exc))
                return None, None
            if grant.granted:
                return grant.slot, None
            waited = time.monotonic() - began
            if waited + grant.wait_s > budget:
                return None, waited
            time.sleep(grant.wait_s)

    def _record(self, landed: list[_Flight], message: _Message) -> list[AttemptResult]:
        """Record the outcomes of deliveries that ended together, in one transaction."""
        line, owner, rng = message.line, message.owner, message.rng
        now = message.clock()
        counted = {flight.record.id: self._count(flight, line) for flight in landed}
        rows: list[Attempt] = []
        results: list[AttemptResult] = []
        with self._journal.transaction(f"outcomes of {len(landed)} deliveries") as conn:
            for flight in landed:
                result, row = _outcome(conn, flight, owner, line, counted, now=now, rng=rng)
                results.append(result)
                if row is not None:
                    rows.append(row)
            attempt_log.write(conn, rows)
        for result in results:
            self._report(result, line)
        return results

    def _count(self, flight: _Flight, line: Line) -> Counted | None:
        """Count a delivery's outcome in its line's circuit; alert when it opened it."""
        if flight.not_started is not None or not flight.counts:
            return None
        ok = flight.error is None or not counts_against(flight.http_status)
        try:
            counted = self._circuits.count(line.name, line.settings, ok=ok, owner=flight.probe)
        except BrokerUnavailable as exc:
            log.warning("circuit_uncounted", line=line.name, error=str(exc))
            return None
        if counted.change is Change.OPENED:
            self._alerts.raise_event(
                Event.DOWNSTREAM_DOWN,
                line=line.name,
                message=f"{line.name}'s downstream failed {counted.failed} of the last "
                f"{counted.counted} deliveries: the circuit is open, one probe every "
                f"{line.settings.circuit_probe_interval_s:g} s, records wait without "
                "spending attempts",
                failed=counted.failed,
                counted=counted.counted,
                window_s=line.settings.circuit_window_s,
            )
            log.error("circuit_opened", line=line.name, failed=counted.failed)
        elif counted.change is Change.CLOSED:
            log.info("circuit_closed", line=line.name)
        return counted

    def _report(self, result: AttemptResult, line: Line) -> None:
        record = result.record
        if record is None or result.outcome is None:
            return
        if result.status is RecordStatus.DONE:
            self._telemetry.count(Counter.DONE, line=line.name)
            log.info("record_done", record_id=record.id, line=line.name, attempts=record.attempts)
        elif result.status is RecordStatus.DEAD:
            report_dead(record, result.error or "", telemetry=self._telemetry, alerts=self._alerts)
        elif result.status is RecordStatus.FAILED:
            self._telemetry.count(Counter.FAILED, line=line.name)
            log.warning(
                "attempt_failed",
                record_id=record.id,
                line=line.name,
                attempts=record.attempts,
                error=result.error,
            )


def _outcome(
    conn: Connection,
    flight: _Flight,
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
    if flight.error is None:
        done = attempts.mark_done(conn, record, owner=owner, now=now)
        outcome = Outcome.DONE if done else Outcome.LEASE_LOST
        row = attempt_row(
            record,
            owner=owner,
            started_at=flight.started_at,
            finished_at=flight.finished_at,
            outcome=outcome,
            http_status=flight.http_status,
        )
        if not done:
            log_lease_lost(record, outcome=RecordStatus.DONE)
            return _lost(record, "done"), row
        return AttemptResult(
            record_id=record.id, record=record, status=RecordStatus.DONE, outcome=outcome
        ), row
    error = f"{type(flight.error).__name__}: {flight.error}"
    circuit = counted.get(record.id)
    if circuit is not None and circuit.state is State.OPEN:
        # The downstream is down, not the record: the attempt does not count.
        wait_s = line.settings.circuit_probe_interval_s + rng.uniform(0, POSTPONE_SPREAD)
        moved = attempts.give_back(
            conn,
            record,
            owner=owner,
            error=f"{error} (not counted: the circuit of {line.name} is open)",
            retry_at=now + timedelta(seconds=wait_s),
            now=now,
        )
        status = RecordStatus.FAILED
    else:
        decision = decide(record.attempts, policy=line.settings, now=now, rng=rng)
        moved = attempts.mark_failed(
            conn, record, owner=owner, error=error, retry_at=decision.retry_at, now=now
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


def _end_spans(together: list[_Flight], results: dict[str, AttemptResult]) -> None:
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
