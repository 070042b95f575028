"""The HTTP sink's deliveries of a message, many in flight at once within one worker
process.

The records of a message are claimed as the process's delivery threads come free (each
its own lease and attempt number; a claimed record's delivery starts at once), then each
is delivered on one of those threads: it asks its line's circuit (`app.delivery.circuit`)
and global limits (`app.delivery.limits`) first, then POSTs over the process's one HTTP
client (keep-alive). Outcomes are recorded as they come, so a slow record holds no other's
outcome; the process's journal writes of one moment share one transaction
(`app.delivery.shared_commits`).

A delivery the circuit or the limits keep from starting spends no attempt: its record is
given back (`failed`, due again soon, its attempt number returned). So is a failure while
the circuit is open: an outage alone never makes a record `dead`."""

from __future__ import annotations

import contextlib
import queue
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import Connection

from app.delivery.circuit import Admission, Circuits, State
from app.delivery.flights import (
    POSTPONE_SPREAD,
    Flight,
    attempt_span,
    end_spans,
    record_outcome,
    report,
)
from app.delivery.gates import DeliveryGates
from app.delivery.limits import DeliveryLimits
from app.delivery.outcomes import (
    AttemptResult,
    http_status_of,
    log_skipped,
)
from app.delivery.paused import PausedLines, hold_back
from app.delivery.shared_commits import SharedCommits
from app.delivery.sinks import deliver_http
from app.delivery.slots import DeliverySlots
from app.errors import BrokerUnavailable
from app.journal import attempt_log, attempts
from app.journal.attempt_log import Attempt
from app.journal.journal import Journal
from app.journal.models import Record
from app.lines import Line
from app.logs import get_logger
from app.observe.alerts import Alerter
from app.observe.telemetry import Telemetry
from app.observe.tracing import SpanKind, Tracing

log = get_logger(__name__)

# How long a delivery thread keeps its attempt's span open waiting for the outcome's
# commit (the journal's own timeout ends a commit well within it).
COMMIT_WAIT_S = 60.0


@dataclass(frozen=True, kw_only=True)
class _Message:
    """The context of one message's deliveries: its line, the lease owner of its
    attempts, its records' traceparents, the clock and the backoff's jitter."""

    line: Line
    owner: str
    parents: dict[str, str]
    clock: Callable[[], datetime]
    rng: random.Random


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
        paused: PausedLines,
        lease_s: float,
    ) -> None:
        self._commits = SharedCommits(journal)
        self._paused = paused
        self._http = http
        self._telemetry = telemetry
        self._alerts = alerts
        self._circuits = circuits
        self._gates = DeliveryGates(
            limits=limits, circuits=circuits, alerts=alerts, lease_s=lease_s
        )
        self._tracing = tracing
        self._lease_s = lease_s
        # Each line's delivery threads and their slots, made on first use: a worker runs
        # one line; the intake runs those of its lines that overflow under `caller_runs`.
        self._pools: dict[str, tuple[ThreadPoolExecutor, DeliverySlots]] = {}
        self._building = threading.Lock()

    def _executor(self, line: Line) -> tuple[ThreadPoolExecutor, DeliverySlots]:
        """`line`'s delivery threads in this process and their slots. Twice as many
        threads as slots: a thread whose delivery is over may still hold its span open
        until its outcome's commit, and the next delivery must not wait for it."""
        with self._building:
            if line.name not in self._pools:
                threads = line.settings.delivery_threads
                pool = ThreadPoolExecutor(
                    max_workers=2 * threads, thread_name_prefix=f"delivery-{line.name}"
                )
                self._pools[line.name] = (pool, DeliverySlots(threads))
            return self._pools[line.name]

    def close(self) -> None:
        for pool, _slots in self._pools.values():
            pool.shutdown(wait=True)

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
        pool, slots = self._executor(line)
        landed: queue.Queue[Flight] = queue.Queue()
        started = 0
        waiting = list(to_run)
        while waiting:
            if self._paused.is_paused(line.name):
                # Paused while the message ran: what it has not claimed waits (`deferred`).
                self._hold_back(waiting, message)
                if probe and ids[0] in waiting:
                    self._circuits.drop_probe(line.name, probe)
                break
            # Claimed only as threads come free: a claimed record's delivery starts at once.
            free = slots.take(len(waiting), timeout_s=self._gates.limit_wait_s())
            if free == 0:
                self._postpone(waiting, message, "no delivery thread came free in time")
                if probe and ids[0] in waiting:
                    self._circuits.drop_probe(line.name, probe)
                break
            chunk, waiting = waiting[:free], waiting[free:]
            try:
                claimed = self._claim(chunk, message)
            except BaseException:
                # The journal did not answer: what went out is still recorded, and the
                # slots of this chunk are given back (the worker would lose them).
                slots.give(free)
                self._collect(landed, started, message, results)
                raise
            slots.give(free - len(claimed))
            if probe and chunk[0] == ids[0] and ids[0] not in {r.id for r in claimed}:
                self._circuits.drop_probe(line.name, probe)
            for record in claimed:
                first = probe if record.id == ids[0] else ""
                pool.submit(self._deliver_to, landed, slots, record, message, first)
            started += len(claimed)
        self._collect(landed, started, message, results)
        return [results[record_id] for record_id in ids]

    def _hold_back(self, ids: list[str], message: _Message) -> None:
        now = message.clock()
        held = self._commits.run(
            f"holding back {len(ids)} records of a paused line",
            lambda conn: hold_back(conn, ids, now=now),
        )
        log.info("records_held_line_paused", line=message.line.name, record_ids=ids[:10], held=held)

    def _claim(self, to_run: list[str], message: _Message) -> list[Record]:
        """Claim an attempt of each of `to_run`, in one transaction; say why of the others."""
        if not to_run:
            return []
        now = message.clock()

        def claim(conn: Connection) -> list[Record]:
            claimed = attempts.claim_attempts(
                conn, to_run, owner=message.owner, lease_s=self._lease_s, now=now
            )
            found = {record.id for record in claimed}
            for record_id in to_run:
                if record_id not in found:
                    log_skipped(conn, record_id, now)
            return claimed

        return self._commits.run(f"claim of {len(to_run)} deliveries", claim)

    def _collect(
        self,
        landed: queue.Queue[Flight],
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
                end_spans(together, results)
        if pending_error is not None:
            raise pending_error

    def _admitted(self, ids: list[str], message: _Message) -> tuple[list[str], str]:
        """The records of `ids` to claim now, and the circuit's probe owner if the first is
        its probe. With the line's circuit open, the others wait as `failed` (postponed,
        no attempt spent) until about the next probe."""
        line, owner = message.line, message.owner
        try:
            if self._circuits.state(line.name).state is State.CLOSED:
                return ids, ""
            probe = f"{owner}:{ids[0]}"
            verdict = self._circuits.admit(
                line.name,
                line.settings,
                owner=probe,
                probe_lifetime_s=self._gates.longest_delivery_s(line),
            )
        except BrokerUnavailable as exc:
            log.warning("circuit_unread", line=line.name, error=str(exc))
            return ids, ""
        if verdict.admission is Admission.GO:
            return ids, ""
        first = 1 if verdict.admission is Admission.PROBE else 0
        waiting = ids[first:]
        if waiting:
            self._postpone(
                waiting,
                message,
                f"the circuit of {line.name} is open (its downstream fails most deliveries)",
                after_s=max(verdict.wait_s, 0.1),
            )
        return ids[:first], (probe if first else "")

    def _postpone(
        self, ids: list[str], message: _Message, why: str, *, after_s: float = 1.0
    ) -> None:
        """No attempt of `ids` starts now (`why`): they wait as `failed`, due again in
        about `after_s`, without spending an attempt."""
        now = message.clock()
        retry_at = now + timedelta(seconds=after_s + message.rng.uniform(0, POSTPONE_SPREAD))
        moved = self._commits.run(
            f"postponing {len(ids)} deliveries",
            lambda conn: attempts.postpone(
                conn, ids, reason=f"not attempted: {why}", retry_at=retry_at, now=now
            ),
        )
        log.info("deliveries_postponed", line=message.line.name, postponed=moved, why=why)

    def _deliver_to(
        self,
        landed: queue.Queue[Flight],
        slots: DeliverySlots,
        record: Record,
        message: _Message,
        probe: str,
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
                    Flight(
                        record=record,
                        started_at=began,
                        finished_at=datetime.now(UTC),
                        error=exc if isinstance(exc, Exception) else RuntimeError(repr(exc)),
                    )
                )
                raise
            finally:
                slots.give()  # its delivery is over: the thread may take the next
            landed.put(flight)
            if flight.committed is not None:
                flight.committed.wait(timeout=COMMIT_WAIT_S)

    def _deliver(
        self, record: Record, message: _Message, probe: str, span_scope: contextlib.ExitStack
    ) -> Flight:
        """On a delivery thread: wait for the circuit and the limits, then POST."""
        line, clock, rng = message.line, message.clock, message.rng
        parent = message.parents.get(record.id)
        started = clock()
        if record.attempts > line.settings.max_attempts:
            # Attempts that never reported back: each one killed its worker process.
            return Flight(
                record=record,
                started_at=started,
                finished_at=clock(),
                error=RuntimeError("the worker was lost on every attempt"),
                counts=False,
            )
        if not probe:
            probe, wait_s = self._gates.ask_circuit(f"{message.owner}:{record.id}", line)
            if wait_s:
                return Flight(
                    record=record,
                    started_at=started,
                    finished_at=clock(),
                    not_started=f"not attempted: the circuit of {line.name} is open",
                    retry_in_s=wait_s + rng.uniform(0, POSTPONE_SPREAD),
                )
        slot, waited = self._gates.wait_for_limits(line)
        if waited is not None:
            if probe:
                self._circuits.drop_probe(line.name, probe)
            return Flight(
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
                signing_secret=line.settings.signing_secret,
            )
        except Exception as exc:  # noqa: BLE001 - any failure is the attempt's
            return Flight(
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
            self._gates.release(line, slot)
        return Flight(
            record=record,
            started_at=started,
            finished_at=clock(),
            http_status=status,
            probe=probe,
            span=span,
            committed=committed,
        )

    def _record(self, landed: list[Flight], message: _Message) -> list[AttemptResult]:
        """Record the outcomes of deliveries that ended together, in one transaction."""
        line, owner, rng = message.line, message.owner, message.rng
        now = message.clock()
        counted = {flight.record.id: self._gates.count(flight, line) for flight in landed}

        def record(conn: Connection) -> list[AttemptResult]:
            rows: list[Attempt] = []
            results: list[AttemptResult] = []
            for flight in landed:
                result, row = record_outcome(conn, flight, owner, line, counted, now=now, rng=rng)
                results.append(result)
                if row is not None:
                    rows.append(row)
            attempt_log.write(conn, rows)
            return results

        results = self._commits.run(f"outcomes of {len(landed)} deliveries", record)
        for result in results:
            report(result, line, telemetry=self._telemetry, alerts=self._alerts)
        return results
