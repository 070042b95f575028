"""The task every line's worker runs: one attempt of a journal record, or of each record
of a batch.

Its message comes from `app.admission.push` (or Celery's own publisher); the (first) record id
is the task id. Retries are owned by the journal, not by countdown messages."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Reject
from celery.signals import worker_process_shutdown, worker_shutdown

from app.admission.push import TASK_NAME, TRACEPARENTS_HEADER
from app.celery_app import pipeline_settings
from app.delivery.outcomes import NOT_ATTEMPTED, AttemptResult, WaitingFor, waiting_for
from app.errors import AttemptsOverran, JournalUnavailable
from app.journal import store
from app.journal.models import Record
from app.lines import Line
from app.telemetry.logs import get_logger
from app.telemetry.tracing import trace_id_of
from app.wiring.runtime import Runtime
from workers import (
    heartbeat,  # noqa: F401 - connects the heartbeat to the worker's signals
    kombu_patches,  # noqa: F401 - one client per channel; alive through a Redis loss
)

log = get_logger(__name__)
# How long a worker waits before handing back a message it could not journal.
JOURNAL_RETRY_PAUSE_S = 1.0

_runtime: tuple[int, Runtime] | None = None
# Threads of a thread pool may ask for the runtime at once: one builds it.
_runtime_lock = threading.Lock()
# The most journal connections a thread pool's process keeps (and as many more at a peak).
MAX_JOURNAL_POOL = 8
# How long an exiting worker process waits for its last spans to be exported (the SDK's
# own 30 s would hold up a pool's restart).
FLUSH_TIMEOUT_MS = 5000


def runtime_for(task: Task[Any, Any]) -> Runtime:
    """This process's runtime, built on first use after any fork (engines and sockets must
    not cross a fork)."""
    global _runtime  # noqa: PLW0603 - one runtime per worker process
    if _runtime is None or _runtime[0] != os.getpid():
        with _runtime_lock:
            if _runtime is None or _runtime[0] != os.getpid():
                _runtime = (
                    os.getpid(),
                    Runtime.build(
                        pipeline_settings(task.app),
                        db_pool_size=_journal_pool_size(task),
                        component="worker",
                    ),
                )
    return _runtime[1]


def _journal_pool_size(task: Task[Any, Any]) -> int:
    """Journal connections a worker process needs: a prefork or solo process runs one task
    at a time (a claim, then its outcomes: two are enough); a thread pool runs as many
    tasks as it has threads, each a short transaction at a time."""
    conf = task.app.conf
    if conf.get("worker_pool") == "threads":
        return max(2, min(MAX_JOURNAL_POOL, int(conf.get("worker_concurrency") or 2) // 2))
    return 2


@worker_process_shutdown.connect
@worker_shutdown.connect
def _flush_spans(**_kwargs: Any) -> None:
    """A pool process exits without running `atexit`: export its last spans first (and
    a solo or thread pool's worker, at its shutdown)."""
    if _runtime is not None and _runtime[0] == os.getpid():
        provider = _runtime[1].tracer_provider
        if provider is not None:
            provider.force_flush(timeout_millis=FLUSH_TIMEOUT_MS)


class AttemptFailed(Exception):
    """A record of the message was not delivered: an attempt failed (its outcome, `failed`
    with its retry due or `dead`, is already committed in the journal, which owns the
    retry), its outcome was ignored (another attempt took the record over), or no attempt
    started and it waits as `failed`, no attempt spent, for its downstream (its line's
    circuit is open, or its downstream asked to wait) or for room under its line's limits.
    Raised so that Celery's task events, and Flower, show the task as failed, with why; the
    message is acked all the same (`acks_on_failure_or_timeout`), never requeued or
    retried by Celery, and the worker logs it as expected (`throws`), without a traceback."""


# How much of the failed records' errors the task's exception carries (Flower shows it).
MAX_FAILURE_TEXT = 2000


@shared_task(
    name=TASK_NAME,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    acks_on_failure_or_timeout=True,
    throws=(AttemptFailed,),
)
def process(self: Task[Any, Any], record_ids: str | list[str]) -> str | list[str | None] | None:
    """Run one attempt of each record of the message: one id, or a batch of them (a line's
    `batch_size`). Returns each record's new status, or None where there was nothing to run.
    Raises `AttemptFailed`, once every outcome is committed, when an attempt failed or
    records were postponed (no attempt spent: they wait for their downstream or for room).

    A message of a paused line starts no attempt: its records wait in the journal
    (`app.admission.pause.hold_back`) and it is acked.

    With the journal unreachable the message goes back on its queue after a pause, rather
    than being acked and left to the stuck threshold; the records of a batch already
    finished are skipped when it comes back."""
    ids = [record_ids] if isinstance(record_ids, str) else record_ids
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        log.error("message_refused", reason="the argument is not a record id or a list of them")
        return None
    rt = runtime_for(self)
    parents = _traceparents(self.request.get(TRACEPARENTS_HEADER))
    try:
        by_id: dict[str, AttemptResult] = {}
        for line, of_line in _by_line(rt, self.request.delivery_info, ids):
            by_id |= {r.record_id: r for r in rt.attempts.run(of_line, line=line, parents=parents)}
    except JournalUnavailable as exc:
        log.warning("journal_unavailable_requeued", record_ids=ids[:10], error=str(exc))
        time.sleep(JOURNAL_RETRY_PAUSE_S)
        raise Reject(str(exc), requeue=True) from exc
    except AttemptsOverran as exc:
        # Its attempts go on and settle their records; what never starts is swept again.
        log.error("attempts_overran", record_ids=ids[:10], error=str(exc))  # noqa: TRY400 - the error says it all; the traceback is only this task's wait
        raise AttemptFailed(str(exc)[:MAX_FAILURE_TEXT]) from exc
    found = [by_id.get(record_id) or AttemptResult(record_id=record_id) for record_id in ids]
    failures = [_failure(result) for result in found if result.failed]
    failures += _postponed(rt, [result.record_id for result in found if result.record is None])
    if failures:
        raise AttemptFailed("; ".join(failures)[:MAX_FAILURE_TEXT])
    statuses = [result.status.value if result.status else None for result in found]
    return statuses[0] if isinstance(record_ids, str) else statuses


def _traceparents(header: object) -> dict[str, str]:
    """The message's `{record id: traceparent}` (`app.admission.push.build_message`); what
    is not a valid traceparent is left out."""
    if not isinstance(header, dict):
        return {}
    return {
        key: value
        for key, value in header.items()
        if isinstance(key, str) and isinstance(value, str) and trace_id_of(value)
    }


def _failure(result: AttemptResult) -> str:
    """One failed attempt, as the task's error shows it: which record, which attempt, what
    became of the record, and the error."""
    record = result.record
    if record is None:  # a failure is always of a record that was claimed
        return f"record {result.record_id}: {result.error}"
    became = result.status.value if result.status else "outcome ignored (lease lost)"
    outcome = result.outcome.value if result.outcome else "-"
    return (
        f"{record.line} {record.business_no} (record {record.id}) attempt {record.attempts} "
        f"{outcome}, record {became}: {result.error}"
    )


def _postponed(rt: Runtime, not_run: list[str]) -> list[str]:
    """Of the records of `not_run` (no attempt of them ran), those that wait as `failed`
    without an attempt spent, for their downstream or for room (`waiting_for`), as the
    task's error shows them: how many wait for what, why, and which records. Nothing when
    the journal does not answer: the records' own status says it."""
    if not not_run:
        return []
    waiting: dict[tuple[WaitingFor, str], list[Record]] = {}
    try:
        with rt.journal.reading("the records a message did not run") as conn:
            where = store.RecordFilter(ids=tuple(not_run))
            found = store.find_records(conn, where, limit=len(not_run))
            for record in found.items:
                why = waiting_for(record)
                if why is not None:
                    reason = (record.last_error or "").removeprefix(NOT_ATTEMPTED)
                    waiting.setdefault((why, reason), []).append(record)
    except JournalUnavailable as exc:
        log.warning("postponed_unread", record_ids=not_run[:10], error=str(exc))
        return []
    return [
        f"postponed: {len(records)}, waiting for {why.value} (no attempt spent): {reason}: "
        + ", ".join(f"{r.line} {r.business_no} (record {r.id})" for r in records)
        for (why, reason), records in waiting.items()
    ]


def _by_line(
    rt: Runtime, delivery_info: Mapping[str, object] | None, ids: list[str]
) -> list[tuple[Line, list[str]]]:
    """The records of the message by line: all of them the line of the queue it came from;
    from another queue (a worker started with `celery -A ... -Q` on a queue of its own),
    each record's own line, read from the journal (a record it does not hold is skipped)."""
    queue = (delivery_info or {}).get("routing_key")
    if queue in rt.lines.names():
        return [(rt.lines.get(str(queue)), ids)]
    by_line: dict[str, list[str]] = {}
    with rt.journal.reading("the lines of a message's records") as conn:
        for record_id in ids:
            record = store.get_record(conn, record_id)
            if record is not None and record.line in rt.lines.names():
                by_line.setdefault(record.line, []).append(record_id)
    return [(rt.lines.get(name), of_line) for name, of_line in by_line.items()]
