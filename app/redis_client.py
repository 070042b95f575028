"""Redis connection rules, shared by every client: ours, the lock's and the
broker's. A `sentinel://` URL (`app.config.redis_url`) gives a client of whichever server Sentinel
names the primary: each new connection asks the sentinels, so after a failover the clients
reconnect to the promoted replica, and a Lua script the new primary lacks is loaded there
again by redis-py's `Script` (on its NOSCRIPT answer).

A pooled connection idle past the health-check interval is replaced before use; TCP
keepalive is on; connects and reads time out, and a timed-out command is retried on a
fresh connection, so a connection a proxy or NAT dropped silently costs at most one
timeout, never a hang."""

from __future__ import annotations

import re
import time
import urllib.parse
from typing import Any

import redis
from redis.connection import AbstractConnection, parse_url
from redis.sentinel import Sentinel, SentinelManagedConnection

from app.config.redis_url import is_sentinel, parse_sentinel_url, sentinel_client_options
from app.config.settings import Settings

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


def _replace_if_idle(conn: AbstractConnection) -> None:
    """redis-py's health check pings a connection idle past the interval and waits for the
    answer. On a connection a proxy or NAT dropped without a word, that wait is the whole
    socket timeout, paid again on each idle connection in turn (in a worker, on the event
    loop that also fetches its tasks: the proxy test saw it stall for 90 s). Replacing the
    connection costs one connect and never waits on a dead one."""
    if conn.health_check_interval and time.monotonic() > conn.next_health_check:
        conn.disconnect()  # type: ignore[no-untyped-call]
        # Set first: the handshake's own commands check health too.
        conn.next_health_check = time.monotonic() + conn.health_check_interval  # type: ignore[assignment]
        conn.connect()  # type: ignore[no-untyped-call]


class Connection(redis.Connection):
    """A TCP connection replaced, not pinged, when it has been idle past the interval."""

    def check_health(self) -> None:
        _replace_if_idle(self)


class SSLConnection(redis.SSLConnection):
    """A TLS connection replaced, not pinged, when it has been idle past the interval."""

    def check_health(self) -> None:
        _replace_if_idle(self)


class UnixDomainSocketConnection(redis.UnixDomainSocketConnection):
    """A Unix-socket connection replaced, not pinged, when idle past the interval."""

    def check_health(self) -> None:
        _replace_if_idle(self)


class SentinelConnection(SentinelManagedConnection):
    """A connection to Sentinel's primary, replaced, not pinged, when idle past the interval
    (its reconnect asks the sentinels where the primary is now)."""

    def check_health(self) -> None:
        _replace_if_idle(self)


_REPLACED_WHEN_IDLE: dict[type, type] = {
    redis.Connection: Connection,
    redis.SSLConnection: SSLConnection,
    redis.UnixDomainSocketConnection: UnixDomainSocketConnection,
    SentinelManagedConnection: SentinelConnection,
}


def replaced_when_idle(base: type) -> type:
    """Our variant of redis-py's connection class `base` (`base` itself when it has none)."""
    return _REPLACED_WHEN_IDLE.get(base, base)


def make_redis(url: str, options: dict[str, Any] | None = None) -> redis.Redis:
    """A client for `url`. Connects lazily: building it needs no live Redis."""
    options = DEFAULT_OPTIONS if options is None else options
    if is_sentinel(url):
        return _sentinel_primary(url, options)
    base = parse_url(url).get("connection_class", redis.Connection)  # type: ignore[no-untyped-call]
    return redis.Redis.from_url(
        url,
        connection_class=replaced_when_idle(base),
        **options,
    )


def _sentinel_primary(url: str, options: dict[str, Any]) -> redis.Redis:
    parsed = parse_sentinel_url(url)
    sentinel = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]  # untyped before redis-py 8.2
        list(parsed.sentinels), sentinel_kwargs=sentinel_client_options(parsed, options)
    )
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call,unused-ignore]  # likewise
        parsed.master,
        redis_class=redis.Redis,
        connection_class=SentinelConnection,
        db=parsed.db,
        username=parsed.username,
        password=parsed.password,
        **options,
    )
    return client


def masked_url(url: str) -> str:
    """`url` with its passwords (a sentinel URL's `sentinel_password` too) replaced by
    `***`, for printing."""
    parts = urllib.parse.urlsplit(url)
    query = re.sub(r"(^|&)(sentinel_password=)[^&]*", r"\1\2***", parts.query)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


def as_text(value: bytes | str) -> str:
    """A Redis reply as text (clients may or may not decode replies)."""
    return value.decode() if isinstance(value, bytes) else value
