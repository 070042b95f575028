"""Done and failed attempts per minute, per line, summed over every process on every host.

Each process folds its outcomes into one Redis hash per line and minute
(`pipeline:throughput:<line>:<minute>`, fields `done` and `failed`), written with the
telemetry's flush (`app.telemetry.counters`), each key expiring after `KEEP_S`. The console
draws the last hour of them as a chart (`GET /v1/throughput`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

import redis

from app.errors import BrokerUnavailable

PREFIX = "pipeline:throughput"
# A bucket outlives the hour the console shows by as much again: a page opened at any time
# finds a full hour.
KEEP_S = 2 * 3600
# The longest window asked for: the hour the console shows (and the keys kept).
MAX_MINUTES = 120


class Outcome(StrEnum):
    """What a bucket counts: records delivered, and attempts that failed (the last attempt
    of a dead record among them)."""

    DONE = "done"
    FAILED = "failed"


def minute_of(at: datetime) -> int:
    """The minute `at` falls in, as unix seconds of its start."""
    seconds = int(at.astimezone(UTC).timestamp())
    return seconds - seconds % 60


def bucket_key(line: str, minute_s: int) -> str:
    """The hash of `line`'s outcomes in the minute that starts at unix `minute_s`."""
    return f"{PREFIX}:{line}:{minute_s}"


@dataclass(frozen=True, kw_only=True)
class Minute:
    """One minute of one line: when it starts, and what it counted."""

    start: datetime
    done: int
    failed: int

    def public(self) -> dict[str, object]:
        return {"minute": self.start.isoformat(), "done": self.done, "failed": self.failed}


def read(
    client: redis.Redis, lines: Iterable[str], *, now: datetime, minutes: int
) -> dict[str, list[Minute]]:
    """The last `minutes` minutes of each line, oldest first, the current minute last
    (minutes with nothing counted are zeros). Raises `BrokerUnavailable`."""
    names = list(lines)
    last = minute_of(now)
    starts = [last - 60 * n for n in range(minutes - 1, -1, -1)]
    try:
        with client.pipeline(transaction=False) as pipe:
            for name in names:
                for start in starts:
                    pipe.hmget(bucket_key(name, start), Outcome.DONE.value, Outcome.FAILED.value)
            answers = pipe.execute()
    except redis.RedisError as exc:
        raise BrokerUnavailable(f"throughput unavailable: {exc}") from exc
    result: dict[str, list[Minute]] = {}
    for index, name in enumerate(names):
        rows = answers[index * len(starts) : (index + 1) * len(starts)]
        result[name] = [
            Minute(
                start=datetime.fromtimestamp(start, UTC),
                done=int(done or 0),
                failed=int(failed or 0),
            )
            for start, (done, failed) in zip(starts, rows, strict=True)
        ]
    return result
