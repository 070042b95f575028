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
from app.threads import LoopThread

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
        self._lock = threading.Lock()
        # Steps only when asked: nothing to do between two asks.
        self._loop = LoopThread(self._step, name="drain", every_s=None)

    def request(self, line: str) -> None:
        """Ask for a pass over `line`'s waiting records, soon."""
        if self._loop.stopping:
            return
        with self._lock:
            self._pending[line] = None
        self._loop.start()
        self._loop.wake()

    def close(self) -> None:
        """Stop after the passes under way (at most `CLOSE_TIMEOUT_S`); the lines still
        waiting are the sweeper's."""
        self._loop.stop(timeout_s=CLOSE_TIMEOUT_S)

    def _step(self) -> None:
        with self._lock:
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
