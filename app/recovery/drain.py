"""The intake's drain: the sweep of one line, run as soon as the intake sees that its new
records wait behind deferred ones while the queue has room.

Without it, a line under a steady flood would move its deferred records only once per
sweep, a bound's worth at a time; with it, they go on as fast as its workers free room,
oldest first. The sweeper still runs: the drain only brings a line's pass forward."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime

from app.errors import Unavailable
from app.recovery.sweeper import Sweeper
from app.telemetry.logs import get_logger

log = get_logger(__name__)

# How long `close` waits for a pass under way.
CLOSE_TIMEOUT_S = 5.0


class Drainer:
    """Runs `Sweeper.drain` for the lines asked for, one pass at a time, on a thread of its
    own: asking for a line already waiting for its pass adds nothing. Never raises into
    the caller of `request`."""

    def __init__(self, sweeper: Sweeper, *, clock: Callable[[], datetime]) -> None:
        self._sweeper = sweeper
        self._clock = clock
        self._pending: dict[str, None] = {}  # an ordered set of line names
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def request(self, line: str) -> None:
        """Ask for a pass over `line`'s waiting records, soon."""
        with self._wake:
            if self._closed:
                return
            self._pending[line] = None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="drain", daemon=True)
                self._thread.start()
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=CLOSE_TIMEOUT_S)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                lines = list(self._pending)
                self._pending.clear()
            for line in lines:
                self._pass(line)

    def _pass(self, line: str) -> None:
        try:
            self._sweeper.drain(line, now=self._clock())
        except Unavailable as exc:
            # The sweeper's next pass takes the records: nothing waits on this one.
            log.warning("drain_failed", line=line, error=str(exc))
        except Exception:  # a thread of its own: log, and serve the next ask
            log.exception("drain_crashed", line=line)
