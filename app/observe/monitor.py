"""The queue monitor (DESIGN §11), run by the active beat every ~15 s: raises `NO_CONSUMER`
when a line has waiting work and no live worker, `BACKLOG` when its oldest unfinished record
is older than the threshold, and `BROKER_DOWN` / `JOURNAL_DOWN` when they do not answer."""

from __future__ import annotations

from datetime import datetime

import redis

from app.errors import BrokerUnavailable, JournalUnavailable
from app.journal.models import RecordStatus
from app.logs import get_logger
from app.observe.line_view import LineStatus, line_statuses
from app.observe.webhooks import Event
from app.runtime import Runtime

log = get_logger(__name__)


def monitor(rt: Runtime, *, now: datetime) -> list[Event]:
    """Check every line once; returns the events raised (before throttling)."""
    raised: list[Event] = []
    try:
        rt.redis.ping()
    except redis.RedisError as exc:
        rt.alerts.raise_event(Event.BROKER_DOWN, line=None, message=f"Redis does not answer: {exc}")
        raised.append(Event.BROKER_DOWN)
    try:
        rows = line_statuses(rt, now=now)
    except JournalUnavailable as exc:
        rt.alerts.raise_event(
            Event.JOURNAL_DOWN,
            line=None,
            message=f"the journal does not answer: {type(exc).__name__}",
        )
        return [*raised, Event.JOURNAL_DOWN]
    except BrokerUnavailable:
        return raised
    for row in rows:
        raised += _check_line(rt, row)
    return raised


# Records that wait for a worker now (a `failed` one waits for its retry time first).
_WAITING = (RecordStatus.RECEIVED, RecordStatus.ENQUEUED, RecordStatus.DEFERRED)


def _check_line(rt: Runtime, row: LineStatus) -> list[Event]:
    raised = []
    # Counted in the journal: a queue message may carry several records (`batch_size`).
    waiting = sum(row.counts.get(status.value, 0) for status in _WAITING)
    if waiting and row.live_workers == 0:
        rt.alerts.raise_event(
            Event.NO_CONSUMER,
            line=row.line,
            message=f"{waiting} records wait on line {row.line!r} "
            f"({row.queue_depth} messages on its queue) and no worker is alive",
            waiting=waiting,
            queue_depth=row.queue_depth,
        )
        raised.append(Event.NO_CONSUMER)
    age = row.oldest_unfinished_age_s
    if age is not None and age > rt.settings.backlog_after_seconds:
        rt.alerts.raise_event(
            Event.BACKLOG,
            line=row.line,
            message=f"the oldest unfinished record of {row.line!r} is {age:.0f} s old",
            oldest_unfinished_age_s=round(age, 1),
            threshold_s=rt.settings.backlog_after_seconds,
        )
        raised.append(Event.BACKLOG)
    return raised
