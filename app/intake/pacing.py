"""A line's intake rate: the share of the shared intake one line may take.

Each line has its own queue, bound and workers, but every line's requests are read,
verified and journaled by the same intake processes. A line with `intake_rate` set is
admitted at most that many requests per second by each intake process. A request over
the rate waits for its turn, after its signature is checked and before it is journaled
(the caller is slowed down: that is the backpressure), so a flood on that line leaves the
intake's time to the other lines. Waiting is bounded: a request that would wait more
than `MAX_WAIT_S`, or find too many of its line already waiting, is answered 429 with
`Retry-After` at once. Nothing of it was journaled: it was not accepted."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from app.errors import RateLimited
from app.intake.gate import LINE_SHARE
from app.lines import LineRegistry

# A request over its line's rate waits at most this long for its turn, else 429.
MAX_WAIT_S = 1.0
# Requests a line may send at once after a quiet spell: this many seconds' worth.
BURST_S = 0.1
# Waits end on multiples of this, so that the requests whose turns fall within one tick go
# on together and share a group commit, a queue message and a worker's claim.
TICK_S = 0.05


class Pacer:
    """Admits requests at `rate` per second in arrival order, `burst` of them at once after
    a quiet spell (the generic cell rate algorithm), with at most `max_waiting` waiting."""

    def __init__(
        self,
        rate: float,
        *,
        burst: int = 1,
        max_wait_s: float = MAX_WAIT_S,
        max_waiting: int = 64,
        tick_s: float = TICK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0 or burst < 1 or max_waiting < 1:
            raise ValueError("a pacer needs a rate above 0, a burst and a waiting room")
        self.interval = 1.0 / rate
        self.tolerance = (burst - 1) * self.interval
        self.max_wait_s = max_wait_s
        self.max_waiting = max_waiting
        self.tick_s = tick_s
        self.clock = clock
        self.due = 0.0  # when the next turn is due (the algorithm's theoretical arrival time)
        self.waiting = 0

    def reserve(self) -> float:
        """Take the next turn: the seconds to wait before it. Raises `RateLimited`, taking
        no turn, when that wait is over `max_wait_s` or `max_waiting` already wait."""
        now = self.clock()
        due = max(self.due, now)
        wait = max(0.0, due - self.tolerance - now)
        if wait > 0 and (wait > self.max_wait_s or self.waiting >= self.max_waiting):
            raise RateLimited(retry_after_s=max(1, math.ceil(wait)))
        self.due = due + self.interval
        if wait <= 0 or self.tick_s <= 0:
            return wait
        # The end of the tick the turn falls in (a turn on a tick's end, give or take the
        # float's error, goes on that tick).
        return math.ceil((now + wait) / self.tick_s - 1e-9) * self.tick_s - now

    async def admit(self) -> None:
        """Wait for this request's turn; `RateLimited` as `reserve` says."""
        wait = self.reserve()
        if wait <= 0:
            return
        self.waiting += 1
        try:
            await asyncio.sleep(wait)
        finally:
            self.waiting -= 1


def pacers_for(lines: LineRegistry, *, in_flight_limit: int) -> dict[str, Pacer]:
    """A pacer for each line that has an `intake_rate`."""
    return {
        line.name: Pacer(
            rate,
            burst=max(1, math.floor(rate * BURST_S)),
            max_waiting=max(1, math.floor(in_flight_limit * LINE_SHARE)),
        )
        for line in lines
        if (rate := line.settings.intake_rate) is not None
    }
