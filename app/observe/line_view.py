"""Per-line status: queue depth and bound, policy, journal counts, oldest unfinished age.

The journal's part reads the whole journal (a GROUP BY over every record): it is read at
most once a `JOURNAL_VIEW_LIFETIME_S` per process, however many poll `/v1/lines` and
`/metrics`, in a read-only transaction that holds up no write."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import redis

from app.admission.pause import LinePause
from app.admission.senders import SenderShare
from app.delivery.circuit import CircuitState
from app.delivery.sinks import stuck_handlers
from app.errors import BrokerUnavailable
from app.journal import store
from app.journal.journal import Journal
from app.lines import LineRegistry
from app.observe.liveness import worker_beats
from app.threads import Recent

# How old the journal's counts may be when they are answered: an open status page asks
# every 2 s, a Prometheus scrape every 15 s or so; a second is fresher than either needs.
JOURNAL_VIEW_LIFETIME_S = 1.0


class QueueDepths(Protocol):
    """How many records a queue holds, and in how many messages (the bounded push knows:
    `Pusher`)."""

    def depth(self, queue: str) -> int:
        """Records waiting or held by a worker. Raises `BrokerUnavailable`."""
        ...

    def messages(self, queue: str) -> int:
        """Messages waiting. Raises `BrokerUnavailable`."""
        ...

    def senders(self, queue: str) -> list[SenderShare]:
        """The senders with records on the queue, busiest first, the rest summed as
        `other`. Raises `BrokerUnavailable`."""
        ...


class CircuitView(Protocol):
    """The lines' circuits (`app.delivery.circuit.CircuitReader`)."""

    def state(self, line: str) -> CircuitState:
        """Raises `BrokerUnavailable`."""
        ...


class PausedView(Protocol):
    """The paused lines as a process sees them (`app.admission.pause.PausedLines`)."""

    def current(self) -> dict[str, LinePause]: ...


@dataclass(frozen=True, kw_only=True)
class LineStatus:
    """One line's row of `pipeline status` and `/v1/lines`."""

    line: str
    # Records on the line's queue, waiting or held by a worker (what the bound counts),
    # and the messages waiting that carry them.
    queue_depth: int | None
    max_queue_length: int
    overflow: str
    live_workers: int | None
    counts: dict[str, int]
    oldest_unfinished_age_s: float | None
    # Paused by an operator: no attempt starts and nothing is pushed until it resumes.
    pause: LinePause | None = None
    # Workers whose heartbeat lives but whose consumer takes nothing (not live); None when
    # Redis does not answer.
    stalled_workers: int | None = None
    # Worker processes whose every handler thread of the line is held by a call that
    # overran; None when Redis does not answer.
    stuck_handlers: int | None = None
    # The circuit of an HTTP-sink line (open: its downstream fails most deliveries); None
    # for another sink, or when Redis does not answer.
    circuit: CircuitState | None = None
    queue_messages: int | None = None
    # Records of one sender taken ahead of the senders past theirs; the senders with
    # records on the queue, busiest first (None when Redis does not answer).
    fair_share: int = 0
    senders: list[SenderShare] | None = None

    @property
    def paused(self) -> bool:
        return self.pause is not None


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
    messages: int = 0
    stalled_workers: int = 0
    stuck_handlers: int = 0
    circuit: CircuitState | None = None
    senders: list[SenderShare] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class LineView:
    """What the journal and Redis say of every line (`/v1/lines`, `pipeline status`,
    the monitor, the metrics)."""

    journal: Journal
    queues: QueueDepths
    redis: redis.Redis
    lines: LineRegistry
    # The paused lines (`app.admission.pause.PausedLines`, read at most once a second).
    paused: PausedView | None = None
    circuits: CircuitView | None = None
    # Seconds, for the age of the journal's view (a clock the tests may move).
    clock: Callable[[], float] = time.monotonic
    journal_lifetime_s: float = JOURNAL_VIEW_LIFETIME_S
    _journal: Recent[JournalView] = field(init=False, repr=False, compare=False)
    _statuses: Recent[list[LineStatus]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # frozen: set once, here
        recent = Recent[JournalView](lifetime_s=self.journal_lifetime_s, clock=self.clock)
        object.__setattr__(self, "_journal", recent)
        statuses = Recent[list[LineStatus]](lifetime_s=self.journal_lifetime_s, clock=self.clock)
        object.__setattr__(self, "_statuses", statuses)

    def recent_statuses(self, *, now: datetime) -> list[LineStatus]:
        """`line_statuses`, computed at most once a `journal_lifetime_s` however many ask
        (the console's page state, polled every 2 s by each open console): the ages are
        those of when they were computed."""
        return self._statuses.get(lambda: self.line_statuses(now=now))

    def journal_view(self) -> JournalView:
        """Counts by status and oldest unfinished record, per line, as read at most
        `journal_lifetime_s` ago (one caller reads at a time; see `Recent`).

        Raises `JournalUnavailable` when the journal does not answer."""
        return self._journal.get(self._read_journal)

    def _read_journal(self) -> JournalView:
        with self.journal.reading("reading the line view") as conn:
            return JournalView(
                counts=store.counts_by_status(conn),
                oldest_unfinished={
                    line.name: store.oldest_unfinished(conn, line=line.name) for line in self.lines
                },
            )

    def pauses(self) -> dict[str, LinePause]:
        """The paused lines' pauses, by line."""
        return {} if self.paused is None else self.paused.current()

    def queue_views(self) -> dict[str, QueueView]:
        """Queue depth and live workers per line. Raises `BrokerUnavailable`."""
        views = {}
        for line in self.lines:
            beats = worker_beats(self.redis, line.name)
            stalled = sum(1 for beat in beats if beat.stalled)
            circuit = None
            if self.circuits is not None and line.http_sink:
                circuit = self.circuits.state(line.name)
            views[line.name] = QueueView(
                depth=self.queues.depth(line.queue),
                messages=self.queues.messages(line.queue),
                senders=self.queues.senders(line.queue),
                live_workers=len(beats) - stalled,
                stalled_workers=stalled,
                stuck_handlers=stuck_handlers(self.redis, line.name) if line.handler else 0,
                circuit=circuit,
            )
        return views

    def line_statuses(self, *, now: datetime) -> list[LineStatus]:
        """Every line's status. Depth and live workers are None when Redis does not answer.

        Raises `JournalUnavailable` when the journal does not answer."""
        journal = self.journal_view()
        paused = self.pauses()
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
                    queue_messages=queue.messages if queue else None,
                    max_queue_length=line.settings.max_queue_length,
                    overflow=line.settings.overflow.value,
                    live_workers=queue.live_workers if queue else None,
                    stalled_workers=queue.stalled_workers if queue else None,
                    stuck_handlers=queue.stuck_handlers if queue else None,
                    circuit=queue.circuit if queue else None,
                    fair_share=line.settings.fair_share,
                    senders=queue.senders if queue else None,
                    counts=journal.counts.get(line.name, {}),
                    oldest_unfinished_age_s=(now - started).total_seconds() if started else None,
                    pause=paused.get(line.name),
                )
            )
        return rows
