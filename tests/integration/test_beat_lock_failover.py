"""The beat's lock across a failover that lost its last write: both beats reach Redis through
one address (as Sentinel's clients do), which moves from the old primary to a server that
never got the lock. The beat that takes it there waits one TTL before it counts on it, so
two beats are never active at once."""

from __future__ import annotations

import asyncio

import redis

from app.local.embedded_redis import RedisServer
from beat.lock import LOCK_KEY, BeatLock
from tests.support.processes import free_port
from tests.support.proxy import IdleProxy


def _move(proxy: IdleProxy, *, to_port: int) -> None:
    """New connections go to `to_port`; the open ones are closed (the old primary died)."""
    proxy.blackhole()
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), proxy.loop).result(timeout=10)
    proxy.upstream_port = to_port
    proxy.heal()


def test_a_lock_taken_on_a_promoted_server_that_lost_it_is_counted_on_one_ttl_later(tmp_path):
    old = RedisServer(port=free_port(), workdir=tmp_path / "old")
    new = RedisServer(port=free_port(), workdir=tmp_path / "new")
    old.start()
    new.start()
    proxy = IdleProxy(upstream_port=old.port, idle_s=3600, mode="close").start()
    clients = [redis.Redis(port=proxy.port, socket_timeout=2) for _ in range(2)]
    clock_s = [100.0]
    try:
        active, standby = (BeatLock(c, ttl_s=10, clock=lambda: clock_s[0]) for c in clients)
        assert active.hold() == (True, None)
        assert standby.hold() == (False, None)
        assert active.active_since() is not None

        # The old primary dies; the replica promoted in its place never got the lock.
        _move(proxy, to_port=new.port)
        clock_s[0] = 101.0
        assert standby.hold()[0]  # the key is gone: the standby takes it...
        assert new.client().get(LOCK_KEY).decode() == standby.identity
        # ...while the active beat, whose last renewal was answered at 100.0, still counts
        # on its hold until 110.0: the standby must not be active before then.
        assert active.active_since() is not None
        assert standby.active_since() is None

        clock_s[0] = 102.0
        assert active.hold() == (False, None)  # told: the other beat holds it now
        assert active.active_since() is None
        assert standby.hold() == (True, None)
        clock_s[0] = 110.9
        assert standby.active_since() is None
        clock_s[0] = 111.0  # one TTL after it took the lock
        assert standby.hold() == (True, None)
        assert standby.active_since() is not None
    finally:
        for client in clients:
            client.close()
        proxy.stop()
        old.stop()
        new.stop()


def test_the_holder_that_takes_the_lock_again_on_the_promoted_server_goes_on_at_once(tmp_path):
    old = RedisServer(port=free_port(), workdir=tmp_path / "old")
    new = RedisServer(port=free_port(), workdir=tmp_path / "new")
    old.start()
    new.start()
    proxy = IdleProxy(upstream_port=old.port, idle_s=3600, mode="close").start()
    client = redis.Redis(port=proxy.port, socket_timeout=2)
    clock_s = [100.0]
    try:
        holder = BeatLock(client, ttl_s=10, clock=lambda: clock_s[0])
        assert holder.hold() == (True, None)
        _move(proxy, to_port=new.port)
        clock_s[0] = 101.0
        # No other beat could count on the lock while this one held it: no pause.
        assert holder.hold()[0]
        assert holder.active_since() is not None
    finally:
        client.close()
        proxy.stop()
        old.stop()
        new.stop()
