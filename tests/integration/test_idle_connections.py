"""A connection that a proxy dropped without a word, while it idled, is replaced before the
next command: no command waits out the socket timeout on it. The socket
timeout here is 60 s, so a client that pinged the dead connection first would not answer
within the test's bound."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kombu import Connection

from app.config.redis import DEFAULT_OPTIONS, make_redis
from app.local.embedded_redis import RedisServer
from tests.support.processes import wait_for
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
