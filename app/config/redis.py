"""The Redis connection: which URLs the pipeline takes, and the clients made from them.

A URL names one server (`redis://`, `rediss://`), or a primary
found through Redis Sentinel:

    sentinel://[:password@]host:port[,host:port…]/db?master=NAME[&sentinel_password=…]

The password is the primary's (and its replicas'); `sentinel_password` is the sentinels'
own, when they require one. A port left out is Sentinel's, 26379. Checked when the settings
are read, so a malformed URL stops every command at its start with one line naming
`PIPELINE_REDIS_URL`, never repeating the URL (it may hold a password).

The connection rules are shared by every client: ours, the lock's and the broker's. A
`sentinel://` URL gives a client of whichever server Sentinel
names the primary: each new connection asks the sentinels, so after a failover the clients
reconnect to the promoted replica, and a Lua script the new primary lacks is loaded there
again by redis-py's `Script` (on its NOSCRIPT answer).

A pooled connection idle past the health-check interval is replaced before use; TCP
keepalive is on; connects and reads time out, and a timed-out command is retried on a
fresh connection, so a connection a proxy or NAT dropped silently costs at most one
timeout, never a hang."""

from __future__ import annotations

import asyncio
import math
import re
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
from redis.connection import AbstractConnection, parse_url
from redis.sentinel import Sentinel, SentinelManagedConnection

SENTINEL_SCHEME = "sentinel"
# Redis Sentinel's own port, as its documentation and sentinel.conf give it.
SENTINEL_PORT = 26379
EXAMPLES = (
    "redis://host:6379/0, rediss://host:6380/0 or sentinel://host1:26379,host2:26379/0?master=NAME"
)
_QUERY_KEYS = {"master", "sentinel_password"}


@dataclass(frozen=True, kw_only=True)
class SentinelUrl:
    """A `sentinel://` URL, read."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


def is_sentinel(url: str) -> bool:
    return url.startswith(f"{SENTINEL_SCHEME}://")


def redis_url_problem(url: str) -> str | None:
    """Why `url` cannot be the pipeline's Redis, as a sentence that never repeats the URL;
    None when it can."""
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme in ("redis", "rediss"):
        return None
    if scheme != SENTINEL_SCHEME:
        return f"must start with redis://, rediss:// or sentinel://; e.g. {EXAMPLES}"
    try:
        parse_sentinel_url(url)
    except ValueError as exc:
        return str(exc)
    return None


def check_redis_url(url: str) -> str:
    """A pydantic validator: `url`, or `ValueError` saying what is wrong with it."""
    problem = redis_url_problem(url)
    if problem is not None:
        raise ValueError(problem)
    return url


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Read a `sentinel://` URL. Raises `ValueError` naming what is wrong (never the URL)."""
    example = "e.g. sentinel://host1:26379,host2:26379/0?master=NAME"
    rest = url.removeprefix(f"{SENTINEL_SCHEME}://")
    rest, _, fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        hosts, userinfo = netloc, ""
    sentinels = tuple(_host_port(part, example) for part in hosts.split(","))
    db_text = path.strip("/") or "0"
    if not db_text.isdigit():
        raise ValueError(f"the database after the sentinels must be a number; {example}")
    params = urllib.parse.parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(params) - _QUERY_KEYS)
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r}; only master and sentinel_password")
    masters = params.get("master", [])
    if len(masters) != 1 or not masters[0].strip():
        raise ValueError(f"names no primary: add ?master=NAME (Sentinel's name for it); {example}")
    username, _, password = userinfo.partition(":")
    sentinel_passwords = params.get("sentinel_password", [])
    if fragment:
        raise ValueError(f"has a '#' part, which a sentinel URL cannot have; {example}")
    return SentinelUrl(
        sentinels=sentinels,
        master=masters[0],
        db=int(db_text),
        username=urllib.parse.unquote(username) or None,
        password=urllib.parse.unquote(password) or None,
        sentinel_password=sentinel_passwords[-1] if sentinel_passwords else None,
    )


def _host_port(text: str, example: str) -> tuple[str, int]:
    if text.startswith("["):  # an IPv6 address, [::1]:26379
        host, _, port_text = text[1:].partition("]")
        port_text = port_text.removeprefix(":")
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise ValueError(f"lists a sentinel with no host; {example}")
    if not port_text:
        return host, SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"lists a sentinel whose port is not a number from 1 to 65535; {example}")
    return host, int(port_text)


def kombu_broker(url: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The broker URL and the extra transport options of kombu's Redis transport for `url`.
    kombu's Sentinel transport takes one `sentinel://` URL per sentinel, `;`-separated, the
    primary's name and the sentinels' own client options as transport options."""
    if not is_sentinel(url):
        return url, {}
    parsed = parse_sentinel_url(url)
    auth = ""
    if parsed.password is not None or parsed.username is not None:
        user = urllib.parse.quote(parsed.username or "", safe="")
        auth = f"{user}:{urllib.parse.quote(parsed.password or '', safe='')}@"
    hosts = [f"[{h}]" if ":" in h else h for h, _ in parsed.sentinels]
    broker = ";".join(
        f"{SENTINEL_SCHEME}://{auth}{host}:{port}/{parsed.db}"
        for host, (_, port) in zip(hosts, parsed.sentinels, strict=True)
    )
    return broker, {
        "master_name": parsed.master,
        "sentinel_kwargs": sentinel_client_options(parsed, options),
    }


def sentinel_client_options(parsed: SentinelUrl, options: dict[str, Any]) -> dict[str, Any]:
    """The options of a client of the sentinels themselves: the same timeouts as the
    primary's, and the sentinels' password if they have one."""
    found = {k: v for k, v in options.items() if k.startswith("socket_")}
    if parsed.sentinel_password is not None:
        found["password"] = parsed.sentinel_password
    return found


# Used where no settings exist (a server we started ourselves).
DEFAULT_OPTIONS: dict[str, Any] = {
    "health_check_interval": 2,
    "socket_keepalive": True,
    "socket_connect_timeout": 2.0,
    "socket_timeout": 5.0,
    "retry_on_timeout": True,
}


def _replace_if_idle(conn: AbstractConnection) -> None:
    """redis-py's health check pings a connection idle past the interval and waits for the
    answer. On a connection a proxy or NAT dropped without a word, that wait is the whole
    socket timeout, paid again on each idle connection in turn (in a worker, on the event
    loop that also fetches its tasks: the proxy test saw it stall for 90 s). Replacing the
    connection costs one connect and never waits on a dead one."""
    if conn.health_check_interval and time.monotonic() > conn.next_health_check:
        conn.disconnect()  # type: ignore[no-untyped-call]
        # The handshake's own commands check health too: not again while it runs, however
        # long it takes (against a Redis that accepts and never answers, each command of
        # it waits the socket timeout, past the interval: that replaced it again, forever).
        conn.next_health_check = math.inf  # type: ignore[assignment]
        try:
            conn.connect()  # type: ignore[no-untyped-call]
        finally:
            conn.next_health_check = time.monotonic() + conn.health_check_interval  # type: ignore[assignment]


async def _replace_if_idle_async(conn: aioredis.connection.AbstractConnection) -> None:
    """`_replace_if_idle` of an asyncio connection."""
    loop_time = asyncio.get_running_loop().time
    if conn.health_check_interval and loop_time() > conn.next_health_check:
        await conn.disconnect()
        conn.next_health_check = math.inf
        try:
            await conn.connect()  # type: ignore[no-untyped-call]
        finally:
            conn.next_health_check = loop_time() + conn.health_check_interval


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


class AsyncConnection(aioredis.Connection):
    """An asyncio TCP connection replaced, not pinged, when idle past the interval."""

    async def check_health(self) -> None:
        await _replace_if_idle_async(self)


class AsyncSSLConnection(aioredis.SSLConnection):
    """An asyncio TLS connection replaced, not pinged, when idle past the interval."""

    async def check_health(self) -> None:
        await _replace_if_idle_async(self)


class AsyncUnixDomainSocketConnection(aioredis.UnixDomainSocketConnection):
    """An asyncio Unix-socket connection replaced, not pinged, when idle past the interval."""

    async def check_health(self) -> None:
        await _replace_if_idle_async(self)


class AsyncSentinelConnection(aiosentinel.SentinelManagedConnection):
    """An asyncio connection to Sentinel's primary, replaced, not pinged, when idle past
    the interval."""

    async def check_health(self) -> None:
        await _replace_if_idle_async(self)


_REPLACED_WHEN_IDLE: dict[type, type] = {
    aioredis.Connection: AsyncConnection,
    aioredis.SSLConnection: AsyncSSLConnection,
    aioredis.UnixDomainSocketConnection: AsyncUnixDomainSocketConnection,
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
        client: redis.Redis = _sentinel_primary(
            url, options, sentinel=Sentinel, redis_class=redis.Redis
        )
        return client
    base = parse_url(url).get("connection_class", redis.Connection)  # type: ignore[no-untyped-call]
    return redis.Redis.from_url(
        url,
        connection_class=replaced_when_idle(base),
        **options,
    )


def make_async_redis(url: str, options: dict[str, Any] | None = None) -> aioredis.Redis:
    """An asyncio client for `url`, with the same options as `make_redis`'s, for code that
    runs on an event loop. Connects lazily, on the loop that first uses it: one client
    serves one loop."""
    options = DEFAULT_OPTIONS if options is None else options
    if is_sentinel(url):
        client: aioredis.Redis = _sentinel_primary(
            url, options, sentinel=aiosentinel.Sentinel, redis_class=aioredis.Redis
        )
        return client
    base = aioredis.connection.parse_url(url).get("connection_class", aioredis.Connection)
    return aioredis.Redis.from_url(url, connection_class=replaced_when_idle(base), **options)


def _sentinel_primary(url: str, options: dict[str, Any], *, sentinel: Any, redis_class: Any) -> Any:
    """A client of the primary the sentinels of `url` name, redis-py's sync or asyncio one
    (`sentinel`, `redis_class`), on our connection class for it."""
    parsed = parse_sentinel_url(url)
    sentinels = sentinel(
        list(parsed.sentinels), sentinel_kwargs=sentinel_client_options(parsed, options)
    )
    connection_class = (
        AsyncSentinelConnection if sentinel is aiosentinel.Sentinel else SentinelConnection
    )
    return sentinels.master_for(
        parsed.master,
        redis_class=redis_class,
        connection_class=connection_class,
        db=parsed.db,
        username=parsed.username,
        password=parsed.password,
        **options,
    )


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
