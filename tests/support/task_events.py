"""Celery's events as Flower receives them: an event receiver on the pipeline's broker, in a
thread, after asking the workers to send task events (Flower's own `enable_events`
broadcast); and Flower's own state and search over what was received."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from celery.events.state import State
from flower.utils.search import TaskSearchEngine

from tests.support.processes import wait_for

Event = dict[str, Any]


class TaskEvents:
    """Every event the workers (`workers` of them) send while the block runs, in order of
    arrival."""

    def __init__(self, celery: Any, *, workers: int = 1) -> None:
        self.celery = celery
        self.workers = workers
        self.lock = threading.Lock()
        self.received: list[Event] = []
        self.connection = celery.connection_for_read()
        self.receiver = celery.events.Receiver(self.connection, handlers={"*": self._on_event})
        self.thread = threading.Thread(target=self._consume, daemon=True)

    def _on_event(self, event: Event) -> None:
        with self.lock:
            self.received.append(event)

    def _consume(self) -> None:
        self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self) -> TaskEvents:
        self.thread.start()
        # As Flower does: the workers start sending task events. A worker answers a
        # heartbeat request with an event: once one is received, the receiver listens.
        replies = self.celery.control.enable_events(reply=True, timeout=10, limit=self.workers)
        assert len(replies) == self.workers, replies

        def listening() -> bool:
            self.celery.control.broadcast("heartbeat")
            return bool(self.of_type("worker-heartbeat"))

        wait_for(listening, timeout_s=15, what="a worker's heartbeat event")
        return self

    def __exit__(
        self,
        _kind: type[BaseException] | None,
        _error: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.receiver.should_stop = True
        self.thread.join(timeout=10)
        self.connection.release()

    def events(self) -> list[Event]:
        with self.lock:
            return list(self.received)

    def of_type(self, kind: str) -> list[Event]:
        return [e for e in self.events() if e["type"] == kind]

    def of_task(self, task_id: str, *kinds: str) -> list[Event]:
        """The events of one task (a record's id), of the given kinds (all if none)."""
        return [
            e
            for e in self.events()
            if e.get("uuid") == task_id and (not kinds or e["type"] in kinds)
        ]

    def wait_for(self, predicate: Callable[[list[Event]], bool], *, what: str) -> None:
        wait_for(lambda: predicate(self.events()), timeout_s=30, what=what)

    def flower(self) -> tuple[State, TaskSearchEngine]:
        """Flower's view of the events received: Celery's event state (Flower's task
        list) and Flower's search over it."""
        state = State()
        for event in self.events():
            state.event(event)
        search = TaskSearchEngine()
        search.rebuild(state.tasks.items())
        return state, search
