"""The registry of live workers: each worker keeps a heartbeat key per line it
consumes, with a TTL; a line's live workers are the keys that have not expired and do not
say that the worker's consumer is stalled (`app.observe.stall`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime

import redis

from app.errors import BrokerUnavailable

PREFIX = "pipeline:workers"


def heartbeat_key(line: str, hostname: str) -> str:
    return f"{PREFIX}:{line}:{hostname}"


@dataclass(frozen=True, kw_only=True)
class ConsumerReport:
    """What a worker's heartbeat says of its consumer of the line (`app.observe.stall`)."""

    # It lives, but its consumer has taken nothing for a while although it could: not live.
    stalled: bool
    taken: int
    consuming: bool
    held: int
    slots: int
    starved_s: float


def publish_heartbeat(
    client: redis.Redis,
    *,
    line: str,
    hostname: str,
    pid: int,
    ttl_s: float,
    now: datetime,
    consumer: ConsumerReport | None = None,
) -> None:
    """Say that `hostname` consumes `line` for the next `ttl_s` seconds, or (a `consumer`
    that is `stalled`) that it lives but takes nothing."""
    value: dict[str, object] = {"hostname": hostname, "pid": pid, "at": now.isoformat()}
    if consumer is not None:
        value["stalled"] = consumer.stalled
        value["consumer"] = asdict(consumer)
    client.set(heartbeat_key(line, hostname), json.dumps(value), px=int(ttl_s * 1000))


def clear_heartbeat(client: redis.Redis, *, line: str, hostname: str) -> None:
    client.delete(heartbeat_key(line, hostname))


@dataclass(frozen=True, kw_only=True)
class WorkerBeat:
    """One worker's unexpired heartbeat for a line."""

    hostname: str
    stalled: bool


def worker_beats(client: redis.Redis, line: str) -> list[WorkerBeat]:
    """The workers of `line` whose heartbeat has not expired, stalled or not, by hostname.

    Raises `BrokerUnavailable`."""
    prefix = f"{PREFIX}:{line}:"
    try:
        keys = sorted(client.scan_iter(match=f"{prefix}*", count=100))
        values = client.mget(keys) if keys else []
    except redis.RedisError as exc:
        raise BrokerUnavailable(f"worker registry unavailable: {exc}") from exc
    return [
        WorkerBeat(hostname=key.decode()[len(prefix) :], stalled=_says_stalled(value))
        for key, value in zip(keys, values, strict=True)
        # Expired between the scan and the read: not live.
        if value is not None
    ]


def _says_stalled(value: bytes | str) -> bool:
    try:
        return json.loads(value).get("stalled") is True
    except (ValueError, AttributeError):
        return False  # a heartbeat of another shape still says the worker lives


def live_workers(client: redis.Redis, line: str) -> list[str]:
    """Hostnames of the workers of `line` whose heartbeat has not expired and whose
    consumer is not stalled.

    Raises `BrokerUnavailable`."""
    return [beat.hostname for beat in worker_beats(client, line) if not beat.stalled]


def stalled_workers(client: redis.Redis, line: str) -> list[str]:
    """Hostnames of the workers of `line` that live but whose consumer is stalled.

    Raises `BrokerUnavailable`."""
    return [beat.hostname for beat in worker_beats(client, line) if beat.stalled]
