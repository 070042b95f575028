"""The queue monitor, run by the active beat every `monitor_interval_seconds`: it judges
every condition alert each run, and each is an incident (`app.telemetry.incidents`): raised
while true (the first raise opens it and sends its message; the next only count), and
resolved by the run that finds it no longer true (`Alerter.settle`).

Per line: `NO_CONSUMER` (records wait and no worker is alive), `BACKLOG` (its oldest
unfinished record is older than the threshold), `DOWNSTREAM_DOWN` (its circuit is open),
`WORKER_STALLED` (a worker's heartbeat lives but its consumer takes nothing), and
`QUEUE_FULL` (the queue is at its bound). The last three are raised where they happen
(the worker whose deliveries opened the circuit, the worker that found its consumer
stalled, the intake that could not fit a record) and only kept open here while they are
true. For the pipeline: `BROKER_DOWN` and `JOURNAL_DOWN` when they do not answer. A
condition whose figures are unknown (Redis away: no depth, no liveness) is not judged: its
incident stays as it is."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis

from app.delivery.circuit import State
from app.errors import BrokerUnavailable, JournalUnavailable
from app.journal.models import RecordStatus
from app.observe.line_view import LineStatus, LineView
from app.telemetry.alerts import Alerter
from app.telemetry.events import Event
from app.telemetry.incidents import Key
from app.telemetry.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class Monitor:
    """Judges every condition of every line and keeps the incidents they call for."""

    view: LineView
    redis: redis.Redis
    alerts: Alerter
    # A line whose oldest unfinished record is older than this raises `BACKLOG`.
    backlog_after_s: float

    def monitor(self, *, now: datetime) -> list[Event]:
        """Judge every condition once; returns the events raised (true this run)."""
        verdict = Verdict()
        try:
            self.redis.ping()
        except redis.RedisError as exc:
            verdict.found(
                Finding(event=Event.BROKER_DOWN, message=f"Redis does not answer: {exc}"),
                line=None,
            )
        else:
            verdict.cleared((Event.BROKER_DOWN, None))
        try:
            rows = self.view.line_statuses(now=now)
        except JournalUnavailable as exc:
            verdict.found(
                Finding(
                    event=Event.JOURNAL_DOWN,
                    message=f"the journal does not answer: {type(exc).__name__}",
                ),
                line=None,
            )
            rows = []
        except BrokerUnavailable:
            rows = []
        else:
            verdict.cleared((Event.JOURNAL_DOWN, None))
        for row in rows:
            judge_line(row, backlog_after_s=self.backlog_after_s, verdict=verdict)
        for line, finding in verdict.raised:
            self.alerts.raise_event(
                finding.event, line=line, message=finding.message, **finding.details
            )
        self.alerts.settle(judged=verdict.judged, present=verdict.present)
        return [finding.event for _line, finding in verdict.raised]


@dataclass
class Verdict:
    """One run's judgement: the conditions judged, those true, and those to raise."""

    judged: set[Key] = field(default_factory=set)
    present: set[Key] = field(default_factory=set)
    raised: list[tuple[str | None, Finding]] = field(default_factory=list)

    def found(self, finding: Finding, *, line: str | None, raise_it: bool = True) -> None:
        key = (finding.event, line)
        self.judged.add(key)
        self.present.add(key)
        if raise_it:
            self.raised.append((line, finding))

    def cleared(self, key: Key) -> None:
        self.judged.add(key)


# The line conditions the monitor raises itself; it judges all of them.
_RAISED_HERE = frozenset({Event.NO_CONSUMER, Event.BACKLOG})


def judge_line(row: LineStatus, *, backlog_after_s: float, verdict: Verdict) -> None:
    """Add `row`'s conditions to `verdict`: those of `check_line` and `more_findings`, each
    judged only when its figures are known."""
    line = row.line
    found = {finding.event: finding for finding in check_line(row, backlog_after_s=backlog_after_s)}
    found.update({finding.event: finding for finding in more_findings(row)})
    known = {
        Event.BACKLOG: True,
        Event.NO_CONSUMER: row.live_workers is not None or row.paused,
        Event.WORKER_STALLED: row.stalled_workers is not None,
        Event.HANDLER_STUCK: row.stuck_handlers is not None,
        Event.DOWNSTREAM_DOWN: row.circuit is not None,
        Event.QUEUE_FULL: row.queue_depth is not None,
    }
    for event, judged in known.items():
        finding = found.get(event)
        if finding is not None:
            # The others are raised where they happen, with their figures (the intake for
            # the records that did not fit, the worker that opened the circuit or found
            # its consumer stalled): here they are only kept open while true.
            verdict.found(finding, line=line, raise_it=event in _RAISED_HERE)
        elif judged:
            verdict.cleared((event, line))


def more_findings(row: LineStatus) -> list[Finding]:
    """The conditions of `row` besides `check_line`'s: an open circuit, stalled workers,
    stuck handler threads, a full queue."""
    found: list[Finding] = []
    if row.circuit is not None and row.circuit.state is State.OPEN:
        since = row.circuit.opened_at.isoformat() if row.circuit.opened_at else "unknown"
        found.append(
            Finding(
                event=Event.DOWNSTREAM_DOWN,
                message=f"the circuit of {row.line!r} is open (since {since}): its records "
                "wait without spending attempts",
                details={"circuit": "open"},
            )
        )
    if row.stalled_workers:
        found.append(
            Finding(
                event=Event.WORKER_STALLED,
                message=f"{row.stalled_workers} worker(s) of {row.line!r} take nothing from "
                "its queue while their heartbeat lives",
                details={"stalled_workers": row.stalled_workers},
            )
        )
    if row.stuck_handlers:
        found.append(
            Finding(
                event=Event.HANDLER_STUCK,
                message=f"{row.stuck_handlers} worker process(es) of {row.line!r} have every "
                "handler thread held by a call that overran: nothing of the line starts "
                "there until one returns",
                details={"stuck_handlers": row.stuck_handlers},
            )
        )
    if row.queue_depth is not None and row.queue_depth >= row.max_queue_length:
        found.append(
            Finding(
                event=Event.QUEUE_FULL,
                message=f"the queue of {row.line!r} is full "
                f"({row.queue_depth}/{row.max_queue_length})",
                details={"depth": row.queue_depth, "limit": row.max_queue_length},
            )
        )
    return found


# Records that wait for a worker now (a `failed` one waits for its retry time first).
_WAITING = (RecordStatus.RECEIVED, RecordStatus.ENQUEUED, RecordStatus.DEFERRED)


@dataclass(frozen=True, kw_only=True)
class Finding:
    """An alert one line's state calls for."""

    event: Event
    message: str
    details: dict[str, Any] = field(default_factory=dict)


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
