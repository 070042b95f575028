"""Running one record: claim an attempt, call the line's handler or sink, record the outcome.

Used by the worker task, and by the intake under `caller_runs`."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import httpx
from sqlalchemy import Connection

from app.delivery.backoff import decide
from app.delivery.sinks import deliver_http, write_table_sink, write_table_sink_all
from app.errors import ConfigError, JournalUnavailable
from app.journal import attempts
from app.journal.journal import Journal
from app.journal.models import Record, RecordStatus
from app.lines import Line, LineRegistry
from app.logs import get_logger
from app.observe.alerts import Alerter
from app.observe.events import Event
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

    def _deliver(self, record: Record, owner: str, clock: Callable[[], datetime]) -> bool:
        """Hand `record` to its line's sink (a table, a downstream, a handler), then mark it
        done (with the table sink, in the same transaction). False when
        `owner`'s attempt lost its lease meanwhile (the outcome is then not recorded)."""
        line = self.lines.get(record.line)
        kind = line.sink.kind
        if kind is SinkKind.TABLE:
            with self.journal.transaction(f"finishing {record.id}") as conn:
                return _write_table_sink(conn, record, owner, clock(), table=line.sink_table)
        if kind is SinkKind.HANDLER and line.handler is not None:
            line.handler(record)
        elif kind is SinkKind.HTTP and line.settings.downstream_url:
            deliver_http(
                self.http,
                record,
                url=line.settings.downstream_url,
                delivered=line.settings.delivered,
                timeout_s=line.settings.delivery_timeout_s,
            )
        else:  # settings validation makes this unreachable
            raise ConfigError(f"line {line.name!r}: sink {line.sink} is not configured")
        with self.journal.transaction(f"finishing {record.id}") as conn:
            return attempts.mark_done(conn, record, owner=owner, now=clock())

    def _claim(
        self,
        conn: Connection,
        record_id: str,
        now: datetime,
        *,
        owner: str,
        sink: bool = True,
        line: Line | None = None,
    ) -> _Claimed:
        """Claim an attempt of `record_id` for `owner` and, for the table sink (unless `sink`
        is False), write it and mark it done in the same transaction. Raises `_SinkRefused`
        when the sink fails: there is no savepoint (one per record cost more than the claim),
        so the caller rolls back and claims again with `sink=False`.

        `line`: the line whose queue the record came from. With the table sink, its claim and
        its marking done are then one statement."""
        if sink and line is not None and line.table_sink:
            done = attempts.claim_done(
                conn, record_id, line=line.name, max_attempts=line.settings.max_attempts, now=now
            )
            if done is not None:
                try:
                    write_table_sink(conn, done, table=line.sink_table, now=now)
                except Exception as exc:
                    raise _SinkRefused(exc) from exc
                return done, True, None, owner
            # Not runnable, in flight, out of attempts or on another line: the claim says which.
        record = attempts.claim_attempt(conn, record_id, owner=owner, lease_s=self.lease_s, now=now)
        finished: bool | None = None
        if sink and record is not None and self._sink_in_claim(record):
            try:
                finished = _write_table_sink(conn, record, owner, now, table=self._table(record))
            except Exception as exc:
                raise _SinkRefused(exc) from exc
        if record is None:
            _log_skipped(conn, record_id, now)
        return record, finished, None, owner

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
        owner = attempts.new_owner()
        what = f"claim of {record_id}"
        try:
            with self.journal.transaction(what) as conn:
                claimed = self._claim(conn, record_id, clock(), owner=owner, line=line)
        except _SinkRefused as refused:
            # Nothing of that transaction was kept: claim alone, so the attempt counts.
            with self.journal.transaction(what) as conn:
                record, _, _, _ = self._claim(conn, record_id, clock(), owner=owner, sink=False)
            claimed = (record, None, refused.error, owner)
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
        owner = attempts.new_owner()
        with self.journal.transaction(f"claim of a batch of {len(record_ids)}") as conn:
            claimed = self._claim_batch(conn, record_ids, clock(), owner=owner)
        return [
            self._after_claim(record_id, one, clock=clock, rng=rng)
            for record_id, one in zip(record_ids, claimed, strict=True)
        ]

    def _claim_batch(
        self, conn: Connection, record_ids: list[str], now: datetime, *, owner: str
    ) -> list[_Claimed]:
        """`_claim` of each of `record_ids` (an id met twice is claimed once): one statement
        claims them all, one marks done and one writes the sink rows of those the sink takes."""
        claimed_now = attempts.claim_attempts(
            conn, record_ids, owner=owner, lease_s=self.lease_s, now=now
        )
        by_id = {record.id: record for record in claimed_now}
        # In the message's order: of two records with one business number, the later one wins.
        in_order = [by_id[i] for i in dict.fromkeys(record_ids) if i in by_id]
        batch = [r for r in in_order if self._sink_in_claim(r)]
        written = _write_table_sink_all(conn, batch, owner, now, table_of=self._table)
        claimed: list[_Claimed] = []
        for record_id in record_ids:
            record = by_id.pop(record_id, None)
            finished, sink_error = written.get(record_id, (None, None))
            if record is None:
                _log_skipped(conn, record_id, now)
            claimed.append(
                (record, finished, sink_error, owner) if record else (None, None, None, owner)
            )
        return claimed

    def _after_claim(
        self,
        record_id: str,
        claimed: _Claimed,
        *,
        clock: Callable[[], datetime],
        rng: random.Random,
    ) -> RecordStatus | None:
        record, finished, sink_error, owner = claimed
        if record is None:
            return None
        line = self.lines.get(record.line)
        if record.attempts > line.settings.max_attempts:
            # Attempts that never reported back: each one killed its worker process.
            return self._record_failure(
                record,
                RuntimeError("the worker was lost on every attempt"),
                owner=owner,
                clock=clock,
                rng=rng,
            )
        if sink_error is not None:
            return self._record_failure(record, sink_error, owner=owner, clock=clock, rng=rng)
        if finished is None:
            try:
                finished = self._deliver(record, owner, clock)
            except JournalUnavailable:
                raise  # the outcome was not recorded: the lease expires, the sweeper takes it
            except Exception as exc:  # noqa: BLE001 - a handler is user code: any failure is an attempt
                return self._record_failure(record, exc, owner=owner, clock=clock, rng=rng)
        if not finished:
            _log_lease_lost(record, outcome=RecordStatus.DONE)
            return None
        self.telemetry.count(Counter.DONE, line=record.line)
        log.info("record_done", record_id=record.id, line=record.line, attempts=record.attempts)
        return RecordStatus.DONE

    def _record_failure(
        self,
        record: Record,
        exc: Exception,
        *,
        owner: str,
        clock: Callable[[], datetime],
        rng: random.Random,
    ) -> RecordStatus | None:
        line = self.lines.get(record.line)
        now = clock()
        decision = decide(record.attempts, policy=line.settings, now=now, rng=rng)
        error = f"{type(exc).__name__}: {exc}"
        with self.journal.transaction(f"recording failure of {record.id}") as conn:
            moved = attempts.mark_failed(
                conn, record, owner=owner, error=error, retry_at=decision.retry_at, now=now
            )
        if not moved:
            _log_lease_lost(
                record, outcome=RecordStatus.DEAD if decision.dead else RecordStatus.FAILED
            )
            return None
        if decision.dead:
            self.telemetry.count(Counter.DEAD, line=record.line)
            log.error(
                "record_dead", record_id=record.id, line=record.line, attempts=record.attempts
            )
            self.alerts.raise_event(
                Event.TASK_DEAD,
                line=record.line,
                message=f"record {record.id} ({record.business_no}) is dead after "
                f"{record.attempts} attempts",
                record_id=record.id,
                business_no=record.business_no,
                attempts=record.attempts,
                error=error[:500],
            )
            return RecordStatus.DEAD
        self.telemetry.count(Counter.FAILED, line=record.line)
        log.warning(
            "attempt_failed",
            record_id=record.id,
            line=record.line,
            attempts=record.attempts,
            retry_at=decision.retry_at.isoformat() if decision.retry_at else None,
            error=error,
        )
        return RecordStatus.FAILED


def _write_table_sink(
    conn: Connection, record: Record, owner: str, now: datetime, *, table: str
) -> bool:
    """Mark `record` done and write its row: exactly once, and only while `owner`'s
    attempt holds its lease. False when it does not (another run took it over)."""
    marked = attempts.mark_done(conn, record, owner=owner, now=now)
    if marked:
        write_table_sink(conn, record, table=table, now=now)
    return marked


# What a claim found: the record (None: nothing to run), whether the table sink finished
# it within the claim (None: not attempted there), the sink's error, if any, and the
# lease owner of the attempt.
_Claimed = tuple[Record | None, bool | None, Exception | None, str]


class _SinkRefused(Exception):
    """The table sink failed within a claim's transaction (a payload the table refuses,
    say): that transaction is rolled back, and the claim is made again on its own."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _log_skipped(conn: Connection, record_id: str, now: datetime) -> None:
    """Say why a message's record was not run: it is final, waiting for its retry, or in
    flight under another attempt's lease (that attempt records the outcome)."""
    log.info(
        "record_skipped",
        record_id=record_id,
        reason=attempts.why_not_claimed(conn, record_id, now=now),
    )


def _write_table_sink_all(
    conn: Connection,
    batch: list[Record],
    owner: str,
    now: datetime,
    *,
    table_of: Callable[[Record], str],
) -> dict[str, tuple[bool | None, Exception | None]]:
    """`_write_table_sink` of each record of `batch`, in a savepoint: all of them at once,
    else (one the table refuses, say) one at a time, so that one fails alone. Maps each
    id to (finished, the sink's error)."""
    if len(batch) > 1 and _all_at_once(conn, batch, owner, now, table_of=table_of):
        return {record.id: (True, None) for record in batch}
    written: dict[str, tuple[bool | None, Exception | None]] = {}
    for record in batch:
        try:
            with conn.begin_nested():
                finished = _write_table_sink(conn, record, owner, now, table=table_of(record))
                written[record.id] = (finished, None)
        except Exception as exc:  # noqa: BLE001 - e.g. a payload the table refuses
            written[record.id] = (None, exc)  # the claim still commits: the attempt counts
    return written


def _all_at_once(
    conn: Connection,
    batch: list[Record],
    owner: str,
    now: datetime,
    *,
    table_of: Callable[[Record], str],
) -> bool:
    """Mark done and write every record of `batch`, in a savepoint; False, with nothing
    of it kept, when any of it fails."""
    try:
        with conn.begin_nested():
            _mark_and_write_all(conn, batch, owner, now, table_of=table_of)
    except Exception:  # noqa: BLE001 - the caller finds it again, record by record
        return False
    return True


def _mark_and_write_all(
    conn: Connection,
    batch: list[Record],
    owner: str,
    now: datetime,
    *,
    table_of: Callable[[Record], str],
) -> None:
    tables = {table_of(record) for record in batch}
    if len(tables) != 1:
        raise _NotAllMarked  # records of several tables: one at a time
    if attempts.mark_done_all(conn, batch, owner=owner, now=now) != len(batch):
        raise _NotAllMarked
    write_table_sink_all(conn, batch, table=tables.pop(), now=now)


class _NotAllMarked(Exception):
    """A record of the batch could not be marked: go record by record."""


def _log_lease_lost(record: Record, *, outcome: RecordStatus) -> None:
    """An attempt's outcome that was not recorded: its lease expired and another attempt
    took it over (that one records the outcome), or the record is final."""
    log.warning(
        "outcome_ignored_lease_lost",
        record_id=record.id,
        line=record.line,
        attempt=record.attempts,
        outcome=outcome.value,
    )
