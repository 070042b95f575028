"""What the worker's main process sees of its Celery consumer, and restarting it.

Celery's consumer sends `task_received` in the main process for every message it takes,
before the pool runs it (`task_rejected` or `task_unknown` for one it refuses): counted
per queue, that is the consumer's progress, which the heartbeat thread reads
(`workers.heartbeat`). What that thread does to the consumer is read it, or hand a call to
the consumer's own event loop (`Consumer.call_soon`, as Celery's remote control does): the
loop is the one place the consumer is changed."""

from __future__ import annotations

import signal
import threading
from collections import Counter, deque
from types import FrameType
from typing import Any

from celery import bootsteps
from celery.signals import task_received, task_rejected, task_unknown
from celery.worker import state

from app.observe.stall import ConsumerSample
from app.telemetry.logs import get_logger

log = get_logger(__name__)

# Celery's shutdown signals: SIGTERM its warm shutdown, SIGQUIT its cold one (after the soft
# shutdown), SIGINT either (`celery.apps.worker`).
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT)

_lock = threading.Lock()
_taken: Counter[str | None] = Counter()


def _count_taken(
    sender: Any = None, request: Any = None, message: Any = None, **_kwargs: Any
) -> None:
    """One message taken off its queue: a task's, or one the consumer refused."""
    source = request if request is not None else message
    info = getattr(source, "delivery_info", None) or {}
    queue = info.get("routing_key")
    with _lock:
        _taken[queue if isinstance(queue, str) else None] += 1


# A message the consumer refuses (unknown task, bad body) is taken all the same.
for _signal in (task_received, task_rejected, task_unknown):
    _signal.connect(_count_taken, weak=False)


class RestartConnection(ConnectionError):
    """Raised on the consumer's event loop to make Celery restart the consumer's connection
    (its own recovery from a lost connection). Not in the pipeline's error tree: it never
    leaves Celery's consumer, which catches it as one of the transport's connection errors."""


class ConsumerProbe:
    """Reads one worker's consumer (from any thread) and restarts its consumption."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        # Restarts handed to the event loop, and those it ran: a loop that runs none of
        # them is stuck itself, which a restart of the consumer cannot cure.
        self.restarts_asked = 0
        self.restarts_run = 0
        # When each restart not yet known to have run was asked (monotonic, oldest first).
        self._asked_at_s: deque[float] = deque()
        # Set by the first shutdown signal (`note_shutdown_signals`).
        self.stop_asked = threading.Event()

    def note_shutdown_signals(self) -> None:
        """Set `stop_asked` at each shutdown signal, before Celery's handler runs. Call it
        in the main thread, once Celery has installed its handlers (at `worker_ready`).
        Celery replaces some of its handlers while it stops: by then the flag is set."""
        for signum in SHUTDOWN_SIGNALS:
            handler = signal.getsignal(signum)
            if callable(handler):
                signal.signal(signum, self._noting(handler))

    def _noting(self, handler: Any) -> Any:
        def note(signum: int, frame: FrameType | None) -> Any:
            self.stop_asked.set()
            return handler(signum, frame)

        return note

    def stopping(self) -> bool:
        """Whether the worker is shutting down: a shutdown signal came, Celery was told to
        stop, or its consumer no longer runs."""
        # Celery's own test of its flags: a warm shutdown's flag is its exit code, often 0.
        flags = (state.should_stop, state.should_terminate)
        # RUN is missing from celery-types' stub of bootsteps; it is in Celery since 3.x.
        run = bootsteps.RUN  # type: ignore[attr-defined]
        return (
            self.stop_asked.is_set()
            or any(flag is not None and flag is not False for flag in flags)
            or self.consumer.blueprint.state != run
        )

    @property
    def restarts_pending(self) -> int:
        return self.restarts_asked - self.restarts_run

    def taken(self, queue: str) -> int:
        """Messages the consumer took from `queue` since the worker started (with those
        whose queue the message did not name)."""
        with _lock:
            return _taken[queue] + _taken[None]

    def consuming(self, queue: str) -> bool:
        """Whether the consumer is subscribed to `queue` now."""
        task_consumer = self.consumer.task_consumer
        return task_consumer is not None and bool(task_consumer.consuming_from(queue))

    def held(self) -> int:
        """Messages taken and not finished: running, or waiting for a pool slot."""
        return len(state.reserved_requests)

    def slots(self) -> int:
        """How many messages the consumer may hold at once: its prefetch count, and no more
        than its pool runs at once (a solo pool runs one, on the event loop, whatever the
        prefetch count its concurrency set)."""
        qos = self.consumer.qos
        value = int(qos.value) if qos is not None else 0
        prefetch = value or int(self.consumer.controller.concurrency or 1)
        limit = getattr(self.consumer.pool, "limit", None)
        return min(prefetch, int(limit)) if limit else prefetch

    def sample(self, queue: str, *, queue_depth: int | None) -> ConsumerSample:
        return ConsumerSample(
            taken=self.taken(queue),
            consuming=self.consuming(queue),
            held=self.held(),
            slots=self.slots(),
            queue_depth=queue_depth,
            stopping=self.stopping(),
        )

    def exit_with(self, code: int) -> None:
        """Make the worker exit with `code` when Celery's shutdown ends it (Celery exits
        with the code its worker holds, which a cold shutdown leaves as it is)."""
        self.consumer.controller.exitcode = code

    def restart_waiting_since_s(self) -> float | None:
        """When the oldest restart that the event loop has not run was handed to it
        (monotonic); None when none waits. The loop runs all it was handed at once."""
        while len(self._asked_at_s) > self.restarts_pending:
            self._asked_at_s.popleft()
        return self._asked_at_s[0] if self._asked_at_s else None

    def restart(self, queue: str, *, consuming: bool, now_s: float) -> None:
        """Hand the consumer's event loop a restart of its consumption of `queue`: a
        cancelled consumer subscribes to the queue again (what `celery control add_consumer`
        does); one that is subscribed but takes nothing reconnects, as Celery does when it
        loses its connection (the messages it holds go back to their queue, and the lease
        of each record keeps a second attempt from starting while the first runs). `now_s`
        is when (monotonic); restarts are asked from one thread, the heartbeat's."""
        self._asked_at_s.append(now_s)
        self.restarts_asked += 1
        if consuming:
            self.consumer.call_soon(self._reconnect, queue)
        else:
            self.consumer.call_soon(self._resubscribe, queue)

    def _resubscribe(self, queue: str) -> None:
        self.restarts_run += 1
        if self.stopping():
            return  # shutting down: the loop runs what is left of its callbacks
        self.consumer.add_task_queue(queue)
        log.warning("consumer_restarted", queue=queue, how="resubscribed")

    def _reconnect(self, queue: str) -> None:
        self.restarts_run += 1
        if self.stopping():
            return  # shutting down: the loop runs what is left of its callbacks
        log.warning("consumer_restarted", queue=queue, how="reconnected")
        raise RestartConnection(f"the consumer of {queue!r} took nothing: reconnecting")
