"""The alert vocabulary: the events the pipeline raises, and one alert as it is logged and
sent."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class Event(StrEnum):
    """Alert events."""

    QUEUE_FULL = "QUEUE_FULL"
    CALLER_RUNS = "CALLER_RUNS"
    TASK_DEAD = "TASK_DEAD"
    NO_CONSUMER = "NO_CONSUMER"
    BACKLOG = "BACKLOG"
    BROKER_DOWN = "BROKER_DOWN"
    JOURNAL_DOWN = "JOURNAL_DOWN"
    BEAT_TAKEOVER = "BEAT_TAKEOVER"
    RECOVERED = "RECOVERED"
    REPLAY_FINISHED = "REPLAY_FINISHED"
    WORKER_STALLED = "WORKER_STALLED"
    DOWNSTREAM_DOWN = "DOWNSTREAM_DOWN"
    # Every handler thread of a line in a worker process is held by a call that overran.
    HANDLER_STUCK = "HANDLER_STUCK"
    # An incident (a condition alert) is over: `details.incident` names its event.
    RESOLVED = "RESOLVED"


@dataclass(frozen=True, kw_only=True)
class AlertEvent:
    """One alert as it is logged and sent; `count` is how many events it stands for."""

    event: Event
    line: str | None
    time: datetime
    count: int
    message: str
    details: dict[str, Any]

    def body(self) -> dict[str, Any]:
        return {
            "event": self.event.value,
            "line": self.line,
            "time": self.time.isoformat(),
            "count": self.count,
            "message": self.message,
            "details": self.details,
        }

    def text(self) -> str:
        where = f" [{self.line}]" if self.line else ""
        folded = f" (x{self.count})" if self.count > 1 else ""
        return f"{self.event.value}{where}{folded}: {self.message}"
