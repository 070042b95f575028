"""Running one record: claim an attempt, call the line's handler or sink, record the outcome
and the attempt's row (`app.journal.attempt_log`) in one transaction.

Used by the worker task, and by the intake under `caller_runs`."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import httpx
from sqlalchemy import Connection

from app.delivery import table_writes
from app.delivery.backoff import decide
from app.delivery.outcomes import (
    AttemptResult,
    attempt_row,
    failure_outcome,
    http_status_of,
    log_lease_lost,
    log_skipped,
    report_dead,
)
from app.delivery.sinks import deliver_http, write_table_sink
from app.errors import ConfigError, JournalUnavailable
from app.journal import attempt_log, attempts
from app.journal.attempt_log import Outcome
from app.journal.journal import Journal
from app.journal.models import Record, RecordStatus
from app.lines import Line, LineRegistry
from app.logs import get_logger
from app.observe.alerts import Alerter
from app.observe.telemetry import Counter, Telemetry
from app.sink_settings import SinkKind

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class AttemptRunner:
    """Runs attempts of records: claims each (a lease), hands it to its line's sink or
    handler, and records the outcome; used by the worker task and by the intake under
    `caller_runs`."""

    journal: Journal
    lines: LineRegistry
    http: httpx.Client
    telemetry: Telemetry
    alerts: Alerter
    # How long an attempt's lease lasts (below the visibility timeout).
    lease_s: float

    def _sink_in_claim(self, record: Record) -> bool:
        """Whether `record` goes to the built-in table sink, within the claim's transaction.

        The table sink runs no user code, so claiming, writing and marking done can share one
        commit; a handler or an HTTP sink runs after the claim is committed, so an attempt
        that kills its worker is still counted."""
        line = self.lines.get(record.line)
        return line.table_sink and record.attempts <= line.settings.max_attempts

    def _table(self, record: Record) -> str:
        """The sink table of `record`'s line."""
        return self.lines.get(record.line).sink_table

    def _deliver(self, claim: _Claim, clock: Callable[[], datetime]) -> bool:
        """Hand the claimed record to its line's sink (a table, a downstream, a handler),
        then mark it done and write the attempt's row (with the table sink, in the same
        transaction). False when the attempt lost its lease meanwhile: the outcome is then
        not recorded, and the row says `lease_lost`."""
        record, owner = claim.record, claim.owner
        assert record is not None
        line = self.lines.get(record.line)
        kind = line.sink.kind
        http_status: int | None = None
        if kind is SinkKind.TABLE:
            with self.journal.transaction(f"finishing {record.id}") as conn:
                return table_writes.write_one(
                    conn,
                    record,
                    owner=owner,
                    started_at=claim.started_at,
                    now=clock(),
                    table=line.sink_table,
                )
        if kind is SinkKind.HANDLER and line.handler is not None:
            line.handler(record)
        elif kind is SinkKind.HTTP and line.settings.downstream_url:
            http_status = deliver_http(
                self.http,
                record,
                url=line.settings.downstream_url,
                delivered=line.settings.delivered,
                timeout_s=line.settings.delivery_timeout_s,
                signing_secret=line.settings.signing_secret,
            )
        else:  # settings validation makes this unreachable
            raise ConfigError(f"line {line.name!r}: sink {line.sink} is not configured")
        with self.journal.transaction(f"finishing {record.id}") as conn:
            now = clock()
            done = attempts.mark_done(conn, record, owner=owner, now=now)
            outcome = Outcome.DONE if done else Outcome.LEASE_LOST
            row = attempt_row(
                record,
                owner=owner,
                started_at=claim.started_at,
                finished_at=now,
                outcome=outcome,
                http_status=http_status,
            )
            attempt_log.write(conn, [row])
            return done

    def _claim(
        self,
        conn: Connection,
        record_id: str,
        clock: Callable[[], datetime],
        *,
        owner: str,
        sink: bool = True,
        line: Line | None = None,
    ) -> _Claim:
        """Claim an attempt of `record_id` for `owner` and, for the table sink (unless `sink`
        is False), write it, mark it done and write the attempt's row in the same
        transaction. Raises `_SinkRefused` when the sink fails: there is no savepoint (one
        per record cost more than the claim), so the caller rolls back and claims again with
        `sink=False`.

        `line`: the line whose queue the record came from. With the table sink, its claim and
        its marking done are then one statement."""
        now = clock()
        if sink and line is not None and line.table_sink:
            done = attempts.claim_done(
                conn, record_id, line=line.name, max_attempts=line.settings.max_attempts, now=now
            )
            if done is not None:
                try:
                    write_table_sink(conn, done, table=line.sink_table, now=now)
                except Exception as exc:
                    raise _SinkRefused(exc) from exc
                row = attempt_row(
                    done, owner=owner, started_at=now, finished_at=clock(), outcome=Outcome.DONE
                )
                attempt_log.write(conn, [row])
                return _Claim(record=done, finished=True, owner=owner, started_at=now)
            # Not runnable, in flight, out of attempts or on another line: the claim says which.
        record = attempts.claim_attempt(conn, record_id, owner=owner, lease_s=self.lease_s, now=now)
        finished: bool | None = None
        if sink and record is not None and self._sink_in_claim(record):
            try:
                finished = table_writes.write_one(
                    conn,
                    record,
                    owner=owner,
                    started_at=now,
                    now=clock(),
                    table=self._table(record),
                )
            except Exception as exc:
                raise _SinkRefused(exc) from exc
        if record is None:
            log_skipped(conn, record_id, now)
        return _Claim(record=record, finished=finished, owner=owner, started_at=now)

    def run_record(
        self,
        record_id: str,
        *,
        clock: Callable[[], datetime],
        rng: random.Random,
        line: Line | None = None,
    ) -> RecordStatus | None:
        """Run one attempt of `record_id`. Returns its new status, or None when there was
        nothing to run (unknown, final, waiting for its retry, or in flight elsewhere) or when
        this attempt lost its lease before its outcome was recorded.

        `line`: the line whose queue the record came from, if known (see `_claim`).

        Raises `JournalUnavailable` when the journal cannot be read or written; the record is
        then left as it was and the sweeper picks it up again."""
        return self.attempt(record_id, clock=clock, rng=rng, line=line).status

    def attempt(
        self,
        record_id: str,
        *,
        clock: Callable[[], datetime],
        rng: random.Random,
        line: Line | None = None,
    ) -> AttemptResult:
        """`run_record`, answering what the attempt came to (its outcome and error)."""
        owner = attempts.new_owner()
        what = f"claim of {record_id}"
        try:
            with self.journal.transaction(what) as conn:
                claimed = self._claim(conn, record_id, clock, owner=owner, line=line)
        except _SinkRefused as refused:
            # Nothing of that transaction was kept: claim alone, so the attempt counts.
            with self.journal.transaction(what) as conn:
                again = self._claim(conn, record_id, clock, owner=owner, sink=False)
            claimed = _Claim(
                record=again.record,
                sink_error=refused.error,
                owner=owner,
                started_at=again.started_at,
            )
        return self._after_claim(record_id, claimed, clock=clock, rng=rng)

    def run_table_sink_batch(
        self,
        record_ids: list[str],
        *,
        clock: Callable[[], datetime],
        rng: random.Random,
    ) -> list[RecordStatus | None]:
        """Run one attempt of each of `record_ids`, records of a line with the table sink:
        one transaction claims, writes and marks done all of them (one commit instead of one
        per record). A record the sink refuses, or one past its attempts, is then handled as
        `run_record` would. Raises `JournalUnavailable`; nothing of the batch is then kept.

        Only for the table sink: a handler runs after its claim is committed, and claiming a
        whole batch first would count an attempt for each record when one of them kills the
        worker."""
        return [r.status for r in self.attempt_batch(record_ids, clock=clock, rng=rng)]

    def attempt_batch(
        self,
        record_ids: list[str],
        *,
        clock: Callable[[], datetime],
        rng: random.Random,
    ) -> list[AttemptResult]:
        """`run_table_sink_batch`, answering what each attempt came to."""
        owner = attempts.new_owner()
        with self.journal.transaction(f"claim of a batch of {len(record_ids)}") as conn:
            claimed = self._claim_batch(conn, record_ids, clock, owner=owner)
        return [
            self._after_claim(record_id, one, clock=clock, rng=rng)
            for record_id, one in zip(record_ids, claimed, strict=True)
        ]

    def _claim_batch(
        self, conn: Connection, record_ids: list[str], clock: Callable[[], datetime], *, owner: str
    ) -> list[_Claim]:
        """`_claim` of each of `record_ids` (an id met twice is claimed once): one statement
        claims them all, one marks done, one writes the sink rows of those the sink takes and
        one their attempts' rows."""
        now = clock()
        claimed_now = attempts.claim_attempts(
            conn, record_ids, owner=owner, lease_s=self.lease_s, now=now
        )
        by_id = {record.id: record for record in claimed_now}
        # In the message's order: of two records with one business number, the later one wins.
        in_order = [by_id[i] for i in dict.fromkeys(record_ids) if i in by_id]
        batch = [r for r in in_order if self._sink_in_claim(r)]
        written = table_writes.write_all(
            conn, batch, owner=owner, started_at=now, now=clock(), table_of=self._table
        )
        claimed: list[_Claim] = []
        for record_id in record_ids:
            record = by_id.pop(record_id, None)
            if record is None:
                log_skipped(conn, record_id, now)
            finished, sink_error = written.get(record_id, (None, None))
            claimed.append(
                _Claim(
                    record=record,
                    finished=finished,
                    sink_error=sink_error,
                    owner=owner,
                    started_at=now,
                )
            )
        return claimed

    def _after_claim(
        self,
        record_id: str,
        claim: _Claim,
        *,
        clock: Callable[[], datetime],
        rng: random.Random,
    ) -> AttemptResult:
        record, finished = claim.record, claim.finished
        if record is None:
            return AttemptResult(record_id=record_id)
        line = self.lines.get(record.line)
        if record.attempts > line.settings.max_attempts:
            # Attempts that never reported back: each one killed its worker process.
            lost = RuntimeError("the worker was lost on every attempt")
            return self._record_failure(claim, lost, clock=clock, rng=rng)
        if claim.sink_error is not None:
            return self._record_failure(claim, claim.sink_error, clock=clock, rng=rng)
        if finished is None:
            try:
                finished = self._deliver(claim, clock)
            except JournalUnavailable:
                raise  # the outcome was not recorded: the lease expires, the sweeper takes it
            except Exception as exc:  # noqa: BLE001 - a handler is user code: any failure is an attempt
                return self._record_failure(claim, exc, clock=clock, rng=rng)
        if not finished:
            log_lease_lost(record, outcome=RecordStatus.DONE)
            return AttemptResult(
                record_id=record_id,
                record=record,
                outcome=Outcome.LEASE_LOST,
                error="the outcome (done) was ignored: another attempt took the record over",
            )
        self.telemetry.count(Counter.DONE, line=record.line)
        log.info("record_done", record_id=record.id, line=record.line, attempts=record.attempts)
        return AttemptResult(
            record_id=record_id, record=record, status=RecordStatus.DONE, outcome=Outcome.DONE
        )

    def _record_failure(
        self,
        claim: _Claim,
        exc: Exception,
        *,
        clock: Callable[[], datetime],
        rng: random.Random,
    ) -> AttemptResult:
        record, owner = claim.record, claim.owner
        assert record is not None
        line = self.lines.get(record.line)
        now = clock()
        decision = decide(record.attempts, policy=line.settings, now=now, rng=rng)
        error = f"{type(exc).__name__}: {exc}"
        with self.journal.transaction(f"recording failure of {record.id}") as conn:
            moved = attempts.mark_failed(
                conn, record, owner=owner, error=error, retry_at=decision.retry_at, now=now
            )
            outcome = failure_outcome(exc) if moved else Outcome.LEASE_LOST
            row = attempt_row(
                record,
                owner=owner,
                started_at=claim.started_at,
                finished_at=now,
                outcome=outcome,
                http_status=http_status_of(exc),
                error=exc,
            )
            attempt_log.write(conn, [row])
        status = None
        if not moved:
            log_lease_lost(
                record, outcome=RecordStatus.DEAD if decision.dead else RecordStatus.FAILED
            )
        elif decision.dead:
            status = RecordStatus.DEAD
            report_dead(record, error, telemetry=self.telemetry, alerts=self.alerts)
        else:
            status = RecordStatus.FAILED
            self.telemetry.count(Counter.FAILED, line=record.line)
            log.warning(
                "attempt_failed",
                record_id=record.id,
                line=record.line,
                attempts=record.attempts,
                retry_at=decision.retry_at.isoformat() if decision.retry_at else None,
                error=error,
            )
        return AttemptResult(
            record_id=record.id, record=record, status=status, outcome=outcome, error=error
        )


@dataclass(frozen=True, kw_only=True)
class _Claim:
    """What a claim found: the record (None: nothing to run), whether the table sink
    finished it within the claim (None: not attempted there), the sink's error, if any,
    the lease owner of the attempt and when the attempt started."""

    record: Record | None
    owner: str
    started_at: datetime
    finished: bool | None = None
    sink_error: Exception | None = None


class _SinkRefused(Exception):
    """The table sink failed within a claim's transaction (a payload the table refuses,
    say): that transaction is rolled back, and the claim is made again on its own."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error
