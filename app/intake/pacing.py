"""A line's intake rate, and a sender's: the share of the shared intake one line, or one
sender on a line, may take.

Each line has its own queue, bound and workers, but every line's requests are read,
verified and journaled by the same intake processes. A line with `intake_rate` set is
admitted at most that many requests per second by each intake process; a line with
`sender_intake_rate` set is admitted at most that many per second from any one sender (the
key id its requests are signed with, `dev` in dev mode), so that one shop's flood leaves
the line's turns to the others. A request over a rate waits for its turn, after its
signature is checked and before it is journaled (the caller is slowed down: that is the
backpressure), so a flood on that line, or from that sender, leaves the intake's time to
the others. A request passes its sender's pacer first, then its line's. Waiting is bounded:
a request that would wait more than `MAX_WAIT_S`, or find too many already waiting, is
answered 429 with `Retry-After` at once. Nothing of it was journaled: it was not
accepted."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from app.errors import RateLimited
from app.intake.gate import LINE_SHARE
from app.lines import LineRegistry

# A request over its line's or its sender's rate waits at most this long for its turn,
# else 429.
MAX_WAIT_S = 1.0
# Requests a line (or a sender) may send at once after a quiet spell: this many seconds'
# worth.
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


class IntakePacers:
    """The intake's pacers: each paced line's own (its `intake_rate`), by line, and one for
    each sender on each line that has a `sender_intake_rate`, made the first time that
    sender is seen on that line."""

    def __init__(
        self,
        lines: dict[str, Pacer],
        sender_rates: dict[str, float],
        *,
        max_waiting: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lines = lines
        self.sender_rates = sender_rates
        self.max_waiting = max_waiting
        self.clock = clock
        # By (line, sender). A dict, never pruned: a sender is a key id that passed the
        # signature check (or `dev`), so there are at most the configured keys plus one.
        self.senders: dict[tuple[str, str], Pacer] = {}

    def for_sender(self, line: str, sender: str) -> Pacer | None:
        """The pacer of `sender` on `line`, made now if this is its first request there;
        None when the line has no `sender_intake_rate`."""
        rate = self.sender_rates.get(line)
        if rate is None:
            return None
        pacer = self.senders.get((line, sender))
        if pacer is None:
            # No await between the look-up and the store: one event loop makes one pacer.
            pacer = self.senders[line, sender] = paced(
                rate, max_waiting=self.max_waiting, clock=self.clock
            )
        return pacer

    async def admit(self, line: str, sender: str) -> None:
        """Wait for this request's turn at its sender's pacer, then at its line's (each if
        the line has one); `RateLimited` from either as `Pacer.reserve` says."""
        sender_pacer = self.for_sender(line, sender)
        if sender_pacer is not None:
            await sender_pacer.admit()
        line_pacer = self.lines.get(line)
        if line_pacer is not None:
            await line_pacer.admit()


def paced(rate: float, *, max_waiting: int, clock: Callable[[], float] = time.monotonic) -> Pacer:
    """A pacer at `rate`, with `BURST_S` of it at once after a quiet spell."""
    return Pacer(
        rate, burst=max(1, math.floor(rate * BURST_S)), max_waiting=max_waiting, clock=clock
    )


def pacers_for(
    lines: LineRegistry, *, in_flight_limit: int, clock: Callable[[], float] = time.monotonic
) -> IntakePacers:
    """A pacer for each line that has an `intake_rate`, and one, made as it is first seen,
    for each sender on each line that has a `sender_intake_rate`."""
    # A line's waiting requests, and a sender's on a line, take at most the line's share of
    # the in-flight limit each (a sender's are bounded by its rate too: a turn more than
    # `MAX_WAIT_S` away is refused).
    max_waiting = max(1, math.floor(in_flight_limit * LINE_SHARE))
    return IntakePacers(
        {
            line.name: paced(rate, max_waiting=max_waiting, clock=clock)
            for line in lines
            if (rate := line.settings.intake_rate) is not None
        },
        {
            line.name: rate
            for line in lines
            if (rate := line.settings.sender_intake_rate) is not None
        },
        max_waiting=max_waiting,
        clock=clock,
    )
