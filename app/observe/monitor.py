"""The queue monitor, run by the active beat every ~15 s: raises `NO_CONSUMER`
when a line has waiting work and no live worker, `BACKLOG` when its oldest unfinished record
is older than the threshold, and `BROKER_DOWN` / `JOURNAL_DOWN` when they do not answer."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis

from app.errors import BrokerUnavailable, JournalUnavailable
from app.journal.models import RecordStatus
from app.logs import get_logger
from app.observe.alerts import Alerter
from app.observe.events import Event
from app.observe.line_view import LineStatus, LineView

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class Monitor:
    """Checks every line and raises the alerts their state calls for."""

    view: LineView
    redis: redis.Redis
    alerts: Alerter
    # A line whose oldest unfinished record is older than this raises `BACKLOG`.
    backlog_after_s: float

    def monitor(self, *, now: datetime) -> list[Event]:
        """Check every line once; returns the events raised (before throttling)."""
        raised: list[Event] = []
        try:
            self.redis.ping()
        except redis.RedisError as exc:
            self.alerts.raise_event(
                Event.BROKER_DOWN, line=None, message=f"Redis does not answer: {exc}"
            )
            raised.append(Event.BROKER_DOWN)
        try:
            rows = self.view.line_statuses(now=now)
        except JournalUnavailable as exc:
            self.alerts.raise_event(
                Event.JOURNAL_DOWN,
                line=None,
                message=f"the journal does not answer: {type(exc).__name__}",
            )
            return [*raised, Event.JOURNAL_DOWN]
        except BrokerUnavailable:
            return raised
        for row in rows:
            for finding in check_line(row, backlog_after_s=self.backlog_after_s):
                self.alerts.raise_event(
                    finding.event, line=row.line, message=finding.message, **finding.details
                )
                raised.append(finding.event)
        return raised


# Records that wait for a worker now (a `failed` one waits for its retry time first).
_WAITING = (RecordStatus.RECEIVED, RecordStatus.ENQUEUED, RecordStatus.DEFERRED)


@dataclass(frozen=True, kw_only=True)
class Finding:
    """An alert one line's state calls for."""

    event: Event
    message: str
    details: dict[str, Any]


def check_line(row: LineStatus, *, backlog_after_s: float) -> list[Finding]:
    """The alerts `row` calls for: `NO_CONSUMER` when records wait and no worker of the line
    is alive (unknown liveness, `None`, raises nothing; a worker whose consumer is stalled
    is not alive, `app.observe.liveness`), `BACKLOG` when its oldest unfinished record is
    older than `backlog_after_s`. A paused line raises neither: its records wait on
    purpose (`pipeline_line_paused` and `/v1/lines` say so); both return after its resume
    if they are still true."""
    found: list[Finding] = []
    if row.paused:
        return found
    # Counted in the journal: a queue message may carry several records (`batch_size`).
    waiting = sum(row.counts.get(status.value, 0) for status in _WAITING)
    if waiting and row.live_workers == 0:
        found.append(
            Finding(
                event=Event.NO_CONSUMER,
                message=f"{waiting} records wait on line {row.line!r} "
                f"({row.queue_depth} on its queue) and no worker is alive",
                details={"waiting": waiting, "queue_depth": row.queue_depth},
            )
        )
    age = row.oldest_unfinished_age_s
    if age is not None and age > backlog_after_s:
        found.append(
            Finding(
                event=Event.BACKLOG,
                message=f"the oldest unfinished record of {row.line!r} is {age:.0f} s old",
                details={"oldest_unfinished_age_s": round(age, 1), "threshold_s": backlog_after_s},
            )
        )
    return found
