"""A record the intake runs itself, inside its request, when its line's queue is full under
`caller_runs`: the line's own thread limiter, and the attempt."""

from __future__ import annotations

import random

import anyio
from fastapi import Request

from app.clock import utcnow
from app.journal import store
from app.journal.models import RecordStatus
from app.lines import Line
from app.runtime import Runtime

_rng = random.Random()  # noqa: S311 - backoff jitter, not cryptography


def caller_run_limiter(request: Request, line: str, tokens: int) -> anyio.CapacityLimiter:
    """The thread limiter of `line`'s caller-run handlers, made on first use."""
    limiters: dict[str, anyio.CapacityLimiter] = request.app.state.caller_run_limiters
    if line not in limiters:
        limiters[line] = anyio.CapacityLimiter(tokens)
    return limiters[line]


def run_here(rt: Runtime, line: Line, record_id: str) -> RecordStatus | None:
    """The attempt of a record the intake runs itself (`caller_runs`): on an HTTP-sink
    line, through the line's circuit and global limits, as its workers deliver."""
    if not line.http_sink:
        return rt.runner.run_record(record_id, clock=utcnow, rng=_rng)
    (result,) = rt.deliveries.run([record_id], line=line, parents={}, clock=utcnow, rng=_rng)
    if result.status is not None:
        return result.status
    # Not attempted (the circuit open, no room under the limits): it waits as `failed`.
    with rt.journal.reading() as conn:
        found = store.get_record(conn, record_id)
    return found.status if found is not None else None
