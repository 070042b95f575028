"""A record the intake runs itself, inside its request, when its line's queue is full under
`caller_runs`: the line's room in this process, and the attempt.

A line's caller-run requests, waiting for one of the line's threads or running, take at
most a share of the intake's in-flight limit (`LINE_SHARE`), so a flood on a slow line
cannot fill the intake and have the other lines answered 503. A request past its line's
share is answered at once with its record `received`: committed, and put on the queue by
the sweeper as room appears, as a deferred record is."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import anyio
from fastapi import Request

from app.errors import AttemptsOverran, JournalUnavailable
from app.intake.gate import LINE_SHARE
from app.journal import store
from app.journal.models import RecordStatus
from app.lines import Line
from app.wiring.runtime import Runtime


@dataclass(kw_only=True)
class CallerRunRoom:
    """A line's caller-run requests in this process: at most `max_requests` at once, of
    which `limiter`'s tokens run (the line's `concurrency`) while the others wait."""

    limiter: anyio.CapacityLimiter
    max_requests: int
    requests: int = 0

    @contextmanager
    def taken(self) -> Iterator[anyio.CapacityLimiter | None]:
        """The limiter this request runs its record under; None when it is past the
        line's share."""
        if self.requests >= self.max_requests:
            yield None
            return
        self.requests += 1
        try:
            yield self.limiter
        finally:
            self.requests -= 1


def caller_run_room(request: Request, line: Line) -> CallerRunRoom:
    """The room of `line`'s caller-run requests, made on first use."""
    rooms: dict[str, CallerRunRoom] = request.app.state.caller_run_rooms
    if line.name not in rooms:
        in_flight: int = request.app.state.runtime.settings.intake_max_concurrent_requests
        rooms[line.name] = CallerRunRoom(
            limiter=anyio.CapacityLimiter(line.settings.concurrency),
            max_requests=max(1, math.floor(in_flight * LINE_SHARE)),
        )
    return rooms[line.name]


def run_here(rt: Runtime, line: Line, record_id: str) -> RecordStatus | None:
    """The attempt of a record the intake runs itself (`caller_runs`), through the same
    engine as its workers' (on an HTTP-sink line, the line's circuit and global limits; the
    line's one deadline on every sink)."""
    (result,) = rt.attempts.run([record_id], line=line)
    if result.status is not None:
        return result.status
    # Not attempted (the circuit open, no room under the limits): it waits as `failed`.
    with rt.journal.reading() as conn:
        found = store.get_record(conn, record_id)
    return found.status if found is not None else None


async def run_in_request(
    request: Request, rt: Runtime, line: Line, record_id: str
) -> RecordStatus | None:
    """Run the record in this request, within its line's room: the status the attempt
    left it in. None when the request is past its line's share, when the journal failed or
    the attempt overran its bound (the record is committed: the sweeper finishes it)."""
    with caller_run_room(request, line).taken() as limiter:
        if limiter is None:
            return None
        try:
            return await anyio.to_thread.run_sync(
                functools.partial(run_here, rt, line, record_id), limiter=limiter
            )
        except (JournalUnavailable, AttemptsOverran):
            return None
