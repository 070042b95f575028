"""`make_redis(url)`: our own Redis client, with the connection rules of DESIGN §11."""

from __future__ import annotations

from typing import Any

import redis

# Health-check a pooled connection idle longer than this before using it.
HEALTH_CHECK_INTERVAL_S = 10
SOCKET_CONNECT_TIMEOUT_S = 2.0
# Longer than any command we send; stops a read on a silently dropped connection.
SOCKET_TIMEOUT_S = 5.0


def redis_options() -> dict[str, Any]:
    """Client options shared by every Redis client of the pipeline."""
    return {
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        "socket_keepalive": True,
        "socket_connect_timeout": SOCKET_CONNECT_TIMEOUT_S,
        "socket_timeout": SOCKET_TIMEOUT_S,
        "retry_on_timeout": True,
    }


def make_redis(url: str) -> redis.Redis:
    """A client for `url`. Connects lazily: building it needs no live Redis."""
    return redis.Redis.from_url(url, **redis_options())
