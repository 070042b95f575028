"""Guards of `workers.kombu_patches`: the private parts of kombu's Redis transport that the
patches replace or read still have the shape the patches were written for.

kombu's code is read as installed, from a private, unpatched copy of the module
(`tests.support.kombu_shipped`). The names a function uses are taken from its compiled code
(`co_names`), so a kombu that stops calling the method a patch replaces fails here. What the
patches do on a live channel is checked against a real server in
`tests/integration/test_kombu_guards.py`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

from app.config import redis as redis_client
from tests.support.kombu_shipped import kombu_redis_as_shipped
from workers import kombu_patches


@pytest.fixture(scope="module")
def shipped() -> Any:
    return kombu_redis_as_shipped()


def _parameters(function: Callable[..., Any]) -> list[tuple[str, Any]]:
    """A function's parameters as (name, default) pairs, in order."""
    return [(p.name, p.default) for p in inspect.signature(function).parameters.values()]


def _reads(function: Callable[..., Any]) -> set[str]:
    """The global and attribute names `function`'s own code uses (for a context manager,
    its generator's)."""
    return set(inspect.unwrap(function).__code__.co_names)


def test_importing_the_patches_puts_ours_in_place_of_kombus_five_methods():
    assert kombu_redis.QoS.restore_unacked is kombu_patches._restore_unacked_or_skip
    assert kombu_redis.QoS.ack is kombu_patches._ack_or_skip
    assert kombu_redis.QoS.reject is kombu_patches._reject_counted
    assert kombu_redis.Channel.conn_or_acquire is kombu_patches._conn_or_acquire
    assert kombu_redis.Channel._connparams is kombu_patches._connparams_without_waiting_checks


def test_the_methods_the_patches_wrap_are_kombus_own_code(shipped):
    """The originals the patches call are the installed kombu's, not another patch's."""
    for saved, own in [
        (kombu_patches._restore_unacked, shipped.QoS.restore_unacked),
        (kombu_patches._reject, shipped.QoS.reject),
        (kombu_patches._connparams, shipped.Channel._connparams),
    ]:
        assert saved.__qualname__ == own.__qualname__
        assert saved.__module__ == own.__module__ == "kombu.transport.redis"
        assert saved.__code__.co_code == own.__code__.co_code, own.__qualname__


@pytest.mark.parametrize(
    ("ours", "kombus"),
    [
        ("_restore_unacked_or_skip", ("QoS", "restore_unacked")),
        ("_ack_or_skip", ("QoS", "ack")),
        ("_reject_counted", ("QoS", "reject")),
        ("_conn_or_acquire", ("Channel", "conn_or_acquire")),
        ("_connparams_without_waiting_checks", ("Channel", "_connparams")),
    ],
)
def test_each_replacement_takes_the_parameters_kombus_method_takes(shipped, ours, kombus):
    """kombu's callers pass these arguments by position and by keyword."""
    cls, name = kombus
    assert _parameters(getattr(kombu_patches, ours)) == _parameters(
        getattr(getattr(shipped, cls), name)
    )


def test_kombus_ack_is_the_two_steps_ours_takes_beside_the_release(shipped):
    """Our ack repeats kombu's (the message out of the unacked index and hash, in one
    pipeline, then the virtual transport's ack) and adds the release of its records; a
    reject without a requeue is the same ack in kombu too."""
    assert {"_remove_from_indices", "execute", "ack"} <= _reads(shipped.QoS.ack)
    assert {"restore_by_tag", "_remove_from_indices", "ack"} <= _reads(shipped.QoS.reject)
    assert {"zrem", "hdel"} <= _reads(shipped.QoS._remove_from_indices)
    assert "_delivered" in _reads(virtual.QoS.ack) or "_quick_ack" in _reads(virtual.QoS.ack)


def test_restore_unacked_takes_an_optional_client_and_restores_the_delivered_tags(shipped):
    """The patch calls it with the client it was given, and on failure counts and clears
    `self._delivered`, the held messages kombu's restore walks and clears itself."""
    restore = shipped.QoS.restore_unacked
    assert _parameters(restore) == [("self", inspect.Parameter.empty), ("client", None)]
    assert {"conn_or_acquire", "_delivered", "restore_by_tag", "clear"} <= _reads(restore)
    assert issubclass(shipped.QoS, virtual.QoS)
    assert "_delivered" in _reads(virtual.QoS.__init__)
    # kombu's channel close restores through it (the path a lost connection takes).
    assert "restore_unacked_once" in _reads(virtual.Channel.close)
    assert "restore_unacked" in _reads(virtual.QoS.restore_unacked_once)


def test_ack_takes_a_delivery_tag_and_is_what_a_channels_ack_calls(shipped):
    ack = shipped.QoS.ack
    assert _parameters(ack) == [
        ("self", inspect.Parameter.empty),
        ("delivery_tag", inspect.Parameter.empty),
    ]
    assert "_remove_from_indices" in _reads(ack)
    # A message's ack (Celery's, after the task) reaches QoS.ack through the channel.
    assert {"qos", "ack"} <= _reads(virtual.Channel.basic_ack)


def test_conn_or_acquire_is_a_context_manager_that_builds_a_client_over_the_pool(shipped):
    """The patch yields one cached client per pool instead of `_create_client()` per call,
    and rebuilds it when `pool` is another pool."""
    conn_or_acquire = shipped.Channel.conn_or_acquire
    assert inspect.isgeneratorfunction(inspect.unwrap(conn_or_acquire))
    assert _parameters(conn_or_acquire) == [("self", inspect.Parameter.empty), ("client", None)]
    assert "_create_client" in _reads(conn_or_acquire)
    create = shipped.Channel._create_client
    assert _parameters(create) == [("self", inspect.Parameter.empty), ("asynchronous", False)]
    assert {"pool", "Client"} <= _reads(create)
    assert isinstance(inspect.getattr_static(shipped.Channel, "pool"), property)
    assert "_get_pool" in _reads(shipped.Channel.pool.fget)
    # kombu replaces the pool by dropping it: `pool` then builds a new one.
    assert {"_pool", "disconnect"} <= _reads(shipped.Channel._disconnect_pools)


def test_the_commands_between_fetches_go_through_conn_or_acquire(shipped):
    """What the one client per channel speeds up: acks, restores, the binding refresh."""
    assert "conn_or_acquire" in _reads(shipped.QoS.pipe_or_acquire)
    assert "pipe_or_acquire" in _reads(shipped.QoS._remove_from_indices)
    assert "conn_or_acquire" in _reads(shipped.QoS.restore_unacked)
    assert "conn_or_acquire" in _reads(shipped.Channel._get)
    assert "_refresh_bindings" in _reads(shipped.Channel.maybe_refresh_binding_expiry)
    assert "conn_or_acquire" in _reads(shipped.Channel._refresh_bindings)


def test_connparams_takes_asynchronous_and_its_result_builds_the_channels_pools(shipped):
    connparams = shipped.Channel._connparams
    assert _parameters(connparams) == [
        ("self", inspect.Parameter.empty),
        ("asynchronous", False),
    ]
    assert {"_connparams", "ConnectionPool"} <= _reads(shipped.Channel._get_pool)
    assert {"connection_class", "connection_class_ssl", "UnixDomainSocketConnection"} <= _reads(
        connparams
    )


def test_each_connection_class_kombu_may_choose_has_our_replaced_when_idle_variant(shipped):
    """The patch swaps the class `_connparams` picks for the synchronous pool; a class it
    has no variant for would be kept as is, pinging again."""
    for base in [
        shipped.Channel.connection_class,
        shipped.Channel.connection_class_ssl,
        redis.UnixDomainSocketConnection,
    ]:
        ours = redis_client.replaced_when_idle(base)
        assert ours is not base
        assert issubclass(ours, base)
        assert ours.check_health is not base.check_health


def test_kombu_watches_the_fetch_and_pubsub_connections_itself(shipped):
    """The patch leaves those two connections unchecked because kombu's event loop drops a
    fetch whose reply is overdue and a pub/sub connection whose pings go unanswered."""
    poller = shipped.MultiChannelPoller
    assert {"_brpop_sent_at", "brpop_timeout", "health_check_interval", "disconnect"} <= _reads(
        poller.maybe_check_brpop_health
    )
    assert {"health_check_response_counter", "check_health", "disconnect"} <= _reads(
        poller.maybe_check_subclient_health
    )
    assert {"maybe_check_brpop_health", "maybe_check_subclient_health"} <= _reads(
        shipped.Transport.register_with_event_loop
    )


def test_the_sentinel_transport_keeps_every_patch(shipped):
    """kombu's Sentinel transport (a `sentinel://` broker URL) is a subclass of the Redis
    transport that overrides none of the patched methods: its channels get ours. Its pool
    is built from `_connparams` (so from our connection classes), over redis-py's
    `SentinelManagedConnection`, which `app.config.redis` replaces when idle."""
    channel = shipped.SentinelChannel
    assert issubclass(channel, shipped.Channel)
    assert shipped.SentinelTransport.Channel is channel
    for name in ("conn_or_acquire", "_connparams", "_create_client", "basic_ack", "QoS"):
        assert name not in vars(channel), name
    assert "_connparams" in _reads(channel._sentinel_managed_pool)
    assert "_sentinel_managed_pool" in _reads(channel._get_pool)
    assert channel.connection_class is redis.sentinel.SentinelManagedConnection
    patched = kombu_redis.SentinelChannel
    assert patched.conn_or_acquire is kombu_patches._conn_or_acquire
    assert patched._connparams is kombu_patches._connparams_without_waiting_checks
    assert patched.QoS.ack is kombu_patches._ack_or_skip
    assert patched.QoS.restore_unacked is kombu_patches._restore_unacked_or_skip
    idle = redis_client.replaced_when_idle(patched.connection_class)
    assert issubclass(idle, redis.sentinel.SentinelManagedConnection)
    assert idle.check_health is not redis.sentinel.SentinelManagedConnection.check_health
