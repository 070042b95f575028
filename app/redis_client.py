"""Redis connection rules (DESIGN §11), shared by every client: ours, the lock's and the
broker's. Every pooled connection idle past the health-check interval is pinged before use;
TCP keepalive is on; connects and reads time out, and a timed-out command is retried on a
fresh connection, so a connection a proxy or NAT dropped silently costs one timeout, never
a hang."""

from __future__ import annotations

import urllib.parse
from typing import Any

import redis

from app.settings import Settings

# Used where no settings exist (a server we started ourselves).
DEFAULT_OPTIONS: dict[str, Any] = {
    "health_check_interval": 2,
    "socket_keepalive": True,
    "socket_connect_timeout": 2.0,
    "socket_timeout": 5.0,
    "retry_on_timeout": True,
}


def redis_options(settings: Settings) -> dict[str, Any]:
    """Client options from the settings (0 turns a timeout or the health check off)."""
    return {
        "health_check_interval": settings.redis_health_check_interval_seconds,
        "socket_keepalive": settings.redis_socket_keepalive,
        "socket_connect_timeout": settings.redis_connect_timeout_seconds or None,
        "socket_timeout": settings.redis_socket_timeout_seconds or None,
        "retry_on_timeout": settings.redis_retry_on_timeout,
    }


def make_redis(url: str, options: dict[str, Any] | None = None) -> redis.Redis:
    """A client for `url`. Connects lazily: building it needs no live Redis."""
    return redis.Redis.from_url(url, **(DEFAULT_OPTIONS if options is None else options))


def masked_url(url: str) -> str:
    """`url` with its password replaced by `***`, for printing."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def as_text(value: bytes | str) -> str:
    """A Redis reply as text (clients may or may not decode replies)."""
    return value.decode() if isinstance(value, bytes) else value
