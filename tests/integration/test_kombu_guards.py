"""Guards of `workers.kombu_patches` on a real server: what each patch changes on a live
kombu channel, next to what kombu's own code (an unpatched copy of its Redis transport:
`tests.support.kombu_shipped`) does in the same case. A kombu that no longer behaves the way
a patch was written against fails the test of kombu's own code; a patch that no longer
takes effect fails the test of the patched channel. The shapes the patches rely on are
checked without a server in `tests/unit/test_kombu_guards.py`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Producer, Queue
from kombu.asynchronous import Hub

from app.admission.ledger import UNACKED_KEY
from app.admission.push import Pusher
from app.config import redis as redis_client
from app.local.embedded_redis import RedisServer
from tests.support.kombu_shipped import kombu_redis_as_shipped
from tests.support.processes import free_port
from workers import kombu_patches

pytestmark = pytest.mark.journal_independent

QUEUE = "guards"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own, which it may stop."""
    server = RedisServer(port=free_port(), workdir=tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _transport(kind: str) -> Any:
    """kombu's Redis transport as shipped, or (None: chosen by the URL) as patched."""
    return kombu_redis_as_shipped().Transport if kind == "shipped" else None


@contextmanager
def _holding_one(url: str, kind: str) -> Iterator[tuple[Any, Any]]:
    """A channel and a message it received and has not acked (kombu holds it)."""
    with Connection(url, transport=_transport(kind)) as conn:
        channel = conn.channel()
        queue = Queue(QUEUE)(channel)
        queue.declare()
        Producer(channel).publish({"n": 1}, routing_key=QUEUE)
        message = queue.get()
        assert message is not None
        assert message.delivery_tag in channel.qos._delivered
        yield channel, message


def _pings(client: redis.Redis) -> int:
    """PING commands the server has answered so far."""
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_ping", {}).get("calls", 0))


def _client_id(connection: Any) -> int:
    connection.send_command("CLIENT", "ID")
    return int(connection.read_response())


# Patch 2: a restore or an ack with Redis gone is skipped.


def test_kombus_own_restore_raises_when_redis_is_gone(server):
    with _holding_one(server.url, "shipped") as (channel, _message):
        server.stop()
        with pytest.raises(redis.ConnectionError):
            channel.qos.restore_unacked()


def test_patched_restore_with_redis_gone_is_skipped_and_forgets_the_held_messages(server):
    with _holding_one(server.url, "patched") as (channel, _message):
        server.stop()
        assert channel.qos.restore_unacked() is None
        assert not channel.qos._delivered


def test_kombus_own_ack_raises_when_redis_is_gone(server):
    with _holding_one(server.url, "shipped") as (channel, message):
        server.stop()
        with pytest.raises(redis.ConnectionError):
            channel.qos.ack(message.delivery_tag)


def test_patched_ack_with_redis_gone_is_skipped(server):
    with _holding_one(server.url, "patched") as (channel, message):
        server.stop()
        assert channel.qos.ack(message.delivery_tag) is None


def test_patched_ack_still_removes_the_message_from_kombus_unacked_set(redis_url):
    check = redis_client.make_redis(redis_url)
    try:
        with _holding_one(redis_url, "patched") as (channel, message):
            assert check.hexists(channel.unacked_key, message.delivery_tag)
            message.ack()
            assert not check.hexists(channel.unacked_key, message.delivery_tag)
            assert not check.zscore(channel.unacked_index_key, message.delivery_tag)
    finally:
        check.close()


# Patch 1: one client per channel.


def test_kombus_own_conn_or_acquire_builds_a_new_client_over_the_pool_each_time(redis_url):
    with Connection(redis_url, transport=_transport("shipped")) as conn:
        channel = conn.channel()
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is not second
            assert first.connection_pool is second.connection_pool is channel.pool
        given = redis_client.make_redis(redis_url)
        with channel.conn_or_acquire(given) as client:
            assert client is given
        given.close()


def test_patched_channel_keeps_one_client_until_its_pool_is_replaced(redis_url):
    with Connection(redis_url) as conn:
        channel = conn.channel()
        with channel.conn_or_acquire() as first:
            first.lpush(QUEUE, "a")
        with channel.conn_or_acquire() as second:
            assert second.llen(QUEUE) == 1
        assert second is first
        assert first.connection_pool is channel.pool
        given = redis_client.make_redis(redis_url)
        with channel.conn_or_acquire(given) as client:
            assert client is given
        given.close()
        channel._disconnect_pools()  # what kombu does after a fork and on close
        with channel.conn_or_acquire() as rebuilt:
            assert rebuilt is not first
            assert rebuilt.connection_pool is channel.pool
            assert rebuilt.llen(QUEUE) == 1


# Patch 3: no health-check ping that waits.


def test_kombus_connparams_picks_redis_pys_class_and_an_event_loop_subclass(redis_url):
    """What the patch swaps: redis-py's class for the pool of commands between fetches,
    and kombu's subclass of it (which tells the channel of a disconnect) for the fetch and
    pub/sub pool."""
    with Connection(redis_url, transport=_transport("shipped")) as conn:
        channel = conn.channel()
        assert channel._connparams()["connection_class"] is redis.Connection
        event_loop = channel._connparams(asynchronous=True)["connection_class"]
        assert event_loop.__bases__ == (redis.Connection,)
        assert "disconnect" in vars(event_loop)


def test_patched_pools_use_connections_that_never_ping_before_a_command(redis_url):
    with Connection(redis_url) as conn:
        channel = conn.channel()
        assert channel.pool.connection_class is redis_client.Connection
        event_loop = channel.async_pool.connection_class
        assert event_loop.check_health is kombu_patches._no_check
        kombus = event_loop.__bases__[0]
        assert kombus.__qualname__ == "Channel._connparams.<locals>.Connection"
        assert "disconnect" in vars(kombus)


@pytest.mark.parametrize(
    ("kind", "pool", "pings", "replaced"),
    [
        ("shipped", "pool", 1, False),
        ("shipped", "async_pool", 1, False),
        ("patched", "pool", 0, True),  # replaced when idle instead (app.config.redis)
        ("patched", "async_pool", 0, False),  # kombu's event loop watches it
    ],
)
def test_a_connection_idle_past_the_interval_is_pinged_only_by_kombus_own_classes(
    redis_url, kind, pool, pings, replaced
):
    check = redis_client.make_redis(redis_url)
    try:
        with Connection(redis_url, transport=_transport(kind)) as conn:
            channel = conn.channel()
            connection = getattr(channel, pool).get_connection()
            try:
                before_id = _client_id(connection)
                before = _pings(check)
                assert connection.health_check_interval > 0
                connection.next_health_check = time.monotonic() - 1
                connection.check_health()
                assert _pings(check) - before == pings
                assert (_client_id(connection) != before_id) is replaced
            finally:
                getattr(channel, pool).release(connection)
    finally:
        check.close()


def test_patched_event_loop_connection_still_tells_the_channel_it_disconnected(redis_url):
    """kombu's subclass keeps the channel from polling a socket that is gone; the patch's
    subclass of it must not lose that."""
    with Connection(redis_url) as conn:
        channel = conn.channel()
        connection = channel.async_pool.get_connection()
        channel._in_poll = connection  # as while a fetch waits on it
        connection.disconnect()
        assert channel._in_poll is None
        channel.async_pool.release(connection)


def test_kombu_schedules_its_fetch_and_pubsub_watchdogs_on_a_workers_event_loop(redis_url):
    interval = 7
    hub = Hub()
    try:
        with Connection(redis_url, transport_options={"health_check_interval": interval}) as conn:
            conn.connect()
            conn.transport.register_with_event_loop(conn.connection, hub)
            now = time.monotonic()
            due = {e.entry.fun.__wrapped__.__name__: e.eta - now for e in hub.timer.queue}
            for watchdog in ("maybe_check_brpop_health", "maybe_check_subclient_health"):
                assert watchdog in due
                assert interval - 1 < due[watchdog] <= interval
    finally:
        hub.close()


# `Ledger.scan` reads kombu's hash of held messages; the ack patch releases their count.


def test_a_held_message_is_seen_by_the_scan_and_counted_until_its_ack(redis_url):
    client = redis_client.make_redis(redis_url)
    try:
        pusher = Pusher(client)
        pusher.push(QUEUE, ["01GUARD"], max_length=10)
        assert pusher.depth(QUEUE) == 1
        with Connection(redis_url) as conn:
            channel = conn.channel()
            assert channel.unacked_key == UNACKED_KEY
            message = Queue(QUEUE)(channel).get()
            assert message is not None
            assert client.llen(QUEUE) == 0
            [held] = client.hvals(UNACKED_KEY)
            _payload, exchange, routing_key = json.loads(held)
            assert (exchange, routing_key) == ("", QUEUE)
            assert pusher.ledger.scan(QUEUE).ids == {"01GUARD"}
            assert pusher.depth(QUEUE) == 1  # held by a worker: still in Redis, still counted
            message.ack()
            assert pusher.ledger.scan(QUEUE).ids == set()
            assert pusher.depth(QUEUE) == 0
    finally:
        client.close()
