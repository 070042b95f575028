"""Per-line status: queue depth and bound, policy, journal counts, oldest unfinished age."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import redis

from app.errors import BrokerUnavailable
from app.journal import store
from app.journal.journal import Journal
from app.lines import LineRegistry
from app.observe.liveness import live_workers


class QueueDepths(Protocol):
    """How many messages wait on a queue (the bounded push knows: `Pusher`)."""

    def depth(self, queue: str) -> int:
        """Raises `BrokerUnavailable`."""
        ...


@dataclass(frozen=True, kw_only=True)
class LineStatus:
    """One line's row of `pipeline status` and `/v1/lines`."""

    line: str
    queue_depth: int | None
    max_queue_length: int
    overflow: str
    live_workers: int | None
    counts: dict[str, int]
    oldest_unfinished_age_s: float | None


@dataclass(frozen=True, kw_only=True)
class JournalView:
    """What the journal says of every line."""

    counts: dict[str, dict[str, int]]
    oldest_unfinished: dict[str, datetime | None]


@dataclass(frozen=True, kw_only=True)
class QueueView:
    """What Redis says of one line."""

    depth: int
    live_workers: int


@dataclass(frozen=True, kw_only=True)
class LineView:
    """What the journal and Redis say of every line (`/v1/lines`, `pipeline status`,
    the monitor, the metrics)."""

    journal: Journal
    queues: QueueDepths
    redis: redis.Redis
    lines: LineRegistry

    def journal_view(self) -> JournalView:
        """Counts by status and oldest unfinished record, per line.

        Raises `JournalUnavailable` when the journal does not answer."""
        with self.journal.reading() as conn:
            return JournalView(
                counts=store.counts_by_status(conn),
                oldest_unfinished={
                    line.name: store.oldest_unfinished(conn, line=line.name) for line in self.lines
                },
            )

    def queue_views(self) -> dict[str, QueueView]:
        """Queue depth and live workers per line. Raises `BrokerUnavailable`."""
        return {
            line.name: QueueView(
                depth=self.queues.depth(line.queue),
                live_workers=len(live_workers(self.redis, line.name)),
            )
            for line in self.lines
        }

    def line_statuses(self, *, now: datetime) -> list[LineStatus]:
        """Every line's status. Depth and live workers are None when Redis does not answer.

        Raises `JournalUnavailable` when the journal does not answer."""
        journal = self.journal_view()
        try:
            queues: dict[str, QueueView] = self.queue_views()
        except BrokerUnavailable:
            queues = {}
        rows = []
        for line in self.lines:
            started = journal.oldest_unfinished[line.name]
            queue = queues.get(line.name)
            rows.append(
                LineStatus(
                    line=line.name,
                    queue_depth=queue.depth if queue else None,
                    max_queue_length=line.settings.max_queue_length,
                    overflow=line.settings.overflow.value,
                    live_workers=queue.live_workers if queue else None,
                    counts=journal.counts.get(line.name, {}),
                    oldest_unfinished_age_s=(now - started).total_seconds() if started else None,
                )
            )
        return rows
