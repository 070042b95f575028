"""The registry of live workers: each worker keeps a heartbeat key per line it
consumes, with a TTL; a line's live workers are the keys that have not expired."""

from __future__ import annotations

import json
from datetime import datetime

import redis

from app.errors import BrokerUnavailable

PREFIX = "pipeline:workers"


def heartbeat_key(line: str, hostname: str) -> str:
    return f"{PREFIX}:{line}:{hostname}"


def publish_heartbeat(
    client: redis.Redis, *, line: str, hostname: str, pid: int, ttl_s: float, now: datetime
) -> None:
    """Say that `hostname` consumes `line` for the next `ttl_s` seconds."""
    value = json.dumps({"hostname": hostname, "pid": pid, "at": now.isoformat()})
    client.set(heartbeat_key(line, hostname), value, px=int(ttl_s * 1000))


def clear_heartbeat(client: redis.Redis, *, line: str, hostname: str) -> None:
    client.delete(heartbeat_key(line, hostname))


def live_workers(client: redis.Redis, line: str) -> list[str]:
    """Hostnames of the workers of `line` whose heartbeat has not expired.

    Raises `BrokerUnavailable`."""
    prefix = f"{PREFIX}:{line}:"
    try:
        keys = client.scan_iter(match=f"{prefix}*", count=100)
        return sorted(key.decode()[len(prefix) :] for key in keys)
    except redis.RedisError as exc:
        raise BrokerUnavailable(f"worker registry unavailable: {exc}") from exc
