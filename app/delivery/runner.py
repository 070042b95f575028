"""Running one record: claim an attempt, call the line's handler or sink, record the outcome.

Used by the worker task, and by the intake under `caller_runs`."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Connection

from app.delivery.backoff import decide
from app.delivery.sinks import deliver_http, write_table_sink, write_table_sink_all
from app.errors import JournalUnavailable
from app.journal import attempts
from app.journal.models import Record, RecordStatus
from app.lines import Line
from app.logs import get_logger
from app.observe.telemetry import Counter
from app.observe.webhooks import Event
from app.runtime import Runtime

log = get_logger(__name__)


def _sink_in_claim(rt: Runtime, record: Record) -> bool:
    """Whether `record` goes to the built-in table sink, within the claim's transaction.

    The table sink runs no user code, so claiming, writing and marking done can share one
    commit; a handler or an HTTP sink runs after the claim is committed, so an attempt
    that kills its worker is still counted."""
    line = rt.lines.get(record.line)
    return line.table_sink and record.attempts <= line.settings.max_attempts


def _write_table_sink(conn: Connection, record: Record, owner: str, now: datetime) -> bool:
    """Mark `record` done and write its row: exactly once, and only while `owner`'s
    attempt holds its lease. False when it does not (another run took it over)."""
    marked = attempts.mark_done(conn, record, owner=owner, now=now)
    if marked:
        write_table_sink(conn, record, now=now)
    return marked


def _deliver(rt: Runtime, record: Record, owner: str, clock: Callable[[], datetime]) -> bool:
    """Hand `record` to its line's handler or HTTP sink, then mark it done. False when
    `owner`'s attempt lost its lease meanwhile (the outcome is then not recorded)."""
    line = rt.lines.get(record.line)
    if line.handler is not None:
        line.handler(record)
    elif line.settings.downstream_url:
        deliver_http(
            rt.http,
            record,
            url=line.settings.downstream_url,
            delivered=line.settings.delivered,
            timeout_s=line.settings.delivery_timeout_s,
        )
    else:
        with rt.journal.transaction(f"finishing {record.id}") as conn:
            return _write_table_sink(conn, record, owner, clock())
    with rt.journal.transaction(f"finishing {record.id}") as conn:
        return attempts.mark_done(conn, record, owner=owner, now=clock())


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


def _claim(
    conn: Connection,
    rt: Runtime,
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
                write_table_sink(conn, done, now=now)
            except Exception as exc:
                raise _SinkRefused(exc) from exc
            return done, True, None, owner
        # Not runnable, in flight, out of attempts or on another line: the claim says which.
    record = attempts.claim_attempt(
        conn, record_id, owner=owner, lease_s=rt.settings.lease_seconds, now=now
    )
    finished: bool | None = None
    if sink and record is not None and _sink_in_claim(rt, record):
        try:
            finished = _write_table_sink(conn, record, owner, now)
        except Exception as exc:
            raise _SinkRefused(exc) from exc
    if record is None:
        _log_skipped(conn, record_id, now)
    return record, finished, None, owner


def _log_skipped(conn: Connection, record_id: str, now: datetime) -> None:
    """Say why a message's record was not run: it is final, waiting for its retry, or in
    flight under another attempt's lease (that attempt records the outcome)."""
    log.info(
        "record_skipped",
        record_id=record_id,
        reason=attempts.why_not_claimed(conn, record_id, now=now),
    )


def run_record(
    rt: Runtime,
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
        with rt.journal.transaction(what) as conn:
            claimed = _claim(conn, rt, record_id, clock(), owner=owner, line=line)
    except _SinkRefused as refused:
        # Nothing of that transaction was kept: claim alone, so the attempt counts.
        with rt.journal.transaction(what) as conn:
            record, _, _, _ = _claim(conn, rt, record_id, clock(), owner=owner, sink=False)
        claimed = (record, None, refused.error, owner)
    return _after_claim(rt, record_id, claimed, clock=clock, rng=rng)


def run_table_sink_batch(
    rt: Runtime,
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
    with rt.journal.transaction(f"claim of a batch of {len(record_ids)}") as conn:
        claimed = _claim_batch(conn, rt, record_ids, clock(), owner=owner)
    return [
        _after_claim(rt, record_id, one, clock=clock, rng=rng)
        for record_id, one in zip(record_ids, claimed, strict=True)
    ]


def _claim_batch(
    conn: Connection, rt: Runtime, record_ids: list[str], now: datetime, *, owner: str
) -> list[_Claimed]:
    """`_claim` of each of `record_ids` (an id met twice is claimed once): one statement
    claims them all, one marks done and one writes the sink rows of those the sink takes."""
    claimed_now = attempts.claim_attempts(
        conn, record_ids, owner=owner, lease_s=rt.settings.lease_seconds, now=now
    )
    by_id = {record.id: record for record in claimed_now}
    # In the message's order: of two records with one business number, the later one wins.
    in_order = [by_id[i] for i in dict.fromkeys(record_ids) if i in by_id]
    batch = [r for r in in_order if _sink_in_claim(rt, r)]
    written = _write_table_sink_all(conn, batch, owner, now)
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


def _write_table_sink_all(
    conn: Connection, batch: list[Record], owner: str, now: datetime
) -> dict[str, tuple[bool | None, Exception | None]]:
    """`_write_table_sink` of each record of `batch`, in a savepoint: all of them at once,
    else (one the table refuses, say) one at a time, so that one fails alone. Maps each
    id to (finished, the sink's error)."""
    if len(batch) > 1 and _all_at_once(conn, batch, owner, now):
        return {record.id: (True, None) for record in batch}
    written: dict[str, tuple[bool | None, Exception | None]] = {}
    for record in batch:
        try:
            with conn.begin_nested():
                written[record.id] = (_write_table_sink(conn, record, owner, now), None)
        except Exception as exc:  # noqa: BLE001 - e.g. a payload the table refuses
            written[record.id] = (None, exc)  # the claim still commits: the attempt counts
    return written


def _all_at_once(conn: Connection, batch: list[Record], owner: str, now: datetime) -> bool:
    """Mark done and write every record of `batch`, in a savepoint; False, with nothing
    of it kept, when any of it fails."""
    try:
        with conn.begin_nested():
            _mark_and_write_all(conn, batch, owner, now)
    except Exception:  # noqa: BLE001 - the caller finds it again, record by record
        return False
    return True


def _mark_and_write_all(conn: Connection, batch: list[Record], owner: str, now: datetime) -> None:
    if attempts.mark_done_all(conn, batch, owner=owner, now=now) != len(batch):
        raise _NotAllMarked
    write_table_sink_all(conn, batch, now=now)


class _NotAllMarked(Exception):
    """A record of the batch could not be marked: go record by record."""


def _after_claim(
    rt: Runtime,
    record_id: str,
    claimed: _Claimed,
    *,
    clock: Callable[[], datetime],
    rng: random.Random,
) -> RecordStatus | None:
    record, finished, sink_error, owner = claimed
    if record is None:
        return None
    line = rt.lines.get(record.line)
    if record.attempts > line.settings.max_attempts:
        # Attempts that never reported back: each one killed its worker process.
        return _record_failure(
            rt,
            record,
            RuntimeError("the worker was lost on every attempt"),
            owner=owner,
            clock=clock,
            rng=rng,
        )
    if sink_error is not None:
        return _record_failure(rt, record, sink_error, owner=owner, clock=clock, rng=rng)
    if finished is None:
        try:
            finished = _deliver(rt, record, owner, clock)
        except JournalUnavailable:
            raise  # the outcome was not recorded: the lease expires, the sweeper takes it
        except Exception as exc:  # noqa: BLE001 - a handler is user code: any failure is an attempt
            return _record_failure(rt, record, exc, owner=owner, clock=clock, rng=rng)
    if not finished:
        _log_lease_lost(record, outcome=RecordStatus.DONE)
        return None
    rt.telemetry.count(Counter.DONE, line=record.line)
    log.info("record_done", record_id=record.id, line=record.line, attempts=record.attempts)
    return RecordStatus.DONE


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


def _record_failure(
    rt: Runtime,
    record: Record,
    exc: Exception,
    *,
    owner: str,
    clock: Callable[[], datetime],
    rng: random.Random,
) -> RecordStatus | None:
    line = rt.lines.get(record.line)
    now = clock()
    decision = decide(record.attempts, policy=line.settings, now=now, rng=rng)
    error = f"{type(exc).__name__}: {exc}"
    with rt.journal.transaction(f"recording failure of {record.id}") as conn:
        moved = attempts.mark_failed(
            conn, record, owner=owner, error=error, retry_at=decision.retry_at, now=now
        )
    if not moved:
        _log_lease_lost(record, outcome=RecordStatus.DEAD if decision.dead else RecordStatus.FAILED)
        return None
    if decision.dead:
        rt.telemetry.count(Counter.DEAD, line=record.line)
        log.error("record_dead", record_id=record.id, line=record.line, attempts=record.attempts)
        rt.alerts.raise_event(
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
    rt.telemetry.count(Counter.FAILED, line=record.line)
    log.warning(
        "attempt_failed",
        record_id=record.id,
        line=record.line,
        attempts=record.attempts,
        retry_at=decision.retry_at.isoformat() if decision.retry_at else None,
        error=error,
    )
    return RecordStatus.FAILED
