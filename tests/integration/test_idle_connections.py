"""A connection that a proxy dropped without a word, while it idled, is replaced before the
next command: no command waits out the socket timeout on it. The socket
timeout here is 60 s, so a client that pinged the dead connection first would not answer
within the test's bound."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection

from app.config.redis import DEFAULT_OPTIONS, make_async_redis, make_redis
from app.local.embedded_redis import RedisServer
from tests.support.processes import free_port, wait_for
from tests.support.proxy import IdleProxy
from workers import kombu_patches  # noqa: F401 - the worker's changes to kombu's transport

IDLE_S = 1.0
OPTIONS: dict[str, Any] = {
    **DEFAULT_OPTIONS,
    "health_check_interval": 0.5,
    "socket_timeout": 60.0,
    "retry_on_timeout": False,
}


@pytest.fixture
def proxy(redis_server: RedisServer, redis_url: str) -> Iterator[IdleProxy]:
    proxy = IdleProxy(upstream_port=redis_server.port, idle_s=IDLE_S, mode="drop").start()
    try:
        yield proxy
    finally:
        proxy.stop()


def _answer_within(command: Callable[[], Any], timeout_s: float) -> Any:
    """Run `command` in a thread; its result, or a failure if it is still waiting."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(command()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert result, f"the command was still waiting after {timeout_s} s"
    return result[0]


def _idle_until_dropped(proxy: IdleProxy, dropped_before: int) -> None:
    wait_for(
        lambda: proxy.dropped > dropped_before,
        timeout_s=30,
        what="the proxy to drop the idle connection",
    )


def test_our_client_replaces_a_silently_dropped_connection(proxy: IdleProxy) -> None:
    client = make_redis(proxy.url, OPTIONS)
    try:
        assert client.set("idle:key", "before")
        _idle_until_dropped(proxy, 0)
        assert _answer_within(lambda: client.get("idle:key"), timeout_s=10) == b"before"
    finally:
        client.close()


def test_a_worker_channel_replaces_a_silently_dropped_connection(proxy: IdleProxy) -> None:
    """The commands a worker sends between fetches (acks, kombu's binding refresh, Celery's
    events) go through the channel's pool."""
    options = {k: v for k, v in OPTIONS.items() if k != "socket_connect_timeout"}
    with Connection(proxy.url, transport_options=options) as conn:
        channel: Any = conn.default_channel
        with channel.conn_or_acquire() as client:
            client.lpush("idle:queue", "a")
        _idle_until_dropped(proxy, 0)
        with channel.conn_or_acquire() as client:
            assert _answer_within(lambda: client.llen("idle:queue"), timeout_s=10) == 1


def test_the_delivery_loops_client_replaces_a_silently_dropped_connection(
    proxy: IdleProxy,
) -> None:
    """The attempt engine's asyncio client (the circuit, the limits) gives each round trip
    2 s: a ping on a dead connection would wait out the socket timeout instead."""

    async def after_idle() -> Any:
        client = make_async_redis(proxy.url, OPTIONS)
        try:
            assert await client.set("idle:async", "before")
            await asyncio.to_thread(_idle_until_dropped, proxy, 0)
            async with asyncio.timeout(10):
                return await client.get("idle:async")
        finally:
            await client.aclose()

    assert asyncio.run(after_idle()) == b"before"


def test_a_client_of_a_redis_that_stopped_answering_fails_instead_of_hanging(
    tmp_path: Path,
) -> None:
    """A Redis that accepts and never answers (stopped): a command on a connection idle
    past the interval replaces it, and the new connection's handshake waits the socket
    timeout, past the interval again. That replaced the connection again, without end: a
    command never returned while the server stayed stopped. Now it fails, sync or async."""
    server = RedisServer(port=free_port(), workdir=tmp_path)
    server.start()
    # The product's retry on a timeout, a short socket timeout and a shorter interval.
    options = {
        **OPTIONS,
        "health_check_interval": 0.2,
        "socket_timeout": 1.0,
        "retry_on_timeout": True,
    }
    client = make_redis(server.url, options)
    async_client = make_async_redis(server.url, options)
    loop = asyncio.new_event_loop()
    try:
        assert client.set("stall:key", "before")
        assert loop.run_until_complete(async_client.get("stall:key")) == b"before"
        time.sleep(0.5)  # idle past the interval
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)

        def fails(command: Callable[[], Any]) -> Exception | None:
            try:
                command()
            except redis.RedisError as exc:
                return exc
            return None

        failed = _answer_within(lambda: fails(lambda: client.get("stall:key")), timeout_s=20)
        assert isinstance(failed, redis.RedisError)
        on_loop = _answer_within(
            lambda: fails(lambda: loop.run_until_complete(async_client.get("stall:key"))),
            timeout_s=20,
        )
        assert isinstance(on_loop, redis.RedisError)
    finally:
        if server.pid is not None:
            os.kill(server.pid, signal.SIGCONT)
        client.close()
        loop.run_until_complete(async_client.aclose())
        loop.close()
        server.stop()
