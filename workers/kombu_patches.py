"""Four changes to kombu's Redis transport in the pipeline's workers. Its Sentinel transport
(a `sentinel://` broker) subclasses it without overriding what is changed here, so it gets
the same changes; its connections are redis-py's `SentinelManagedConnection`, which
`app.config.redis` replaces when idle like the others (guarded by the unit tests).

1. One client object per channel. kombu builds a new `redis.Redis` (over the channel's
   connection pool) for every command it sends outside the blocking fetch: an ack, a
   restore, an event. Building one fills a table of ~170 response callbacks, about a
   quarter of a worker's CPU per task. A client over a pool is safe to share, so each
   channel keeps one, rebuilt when the channel's pool is replaced.

2. An ack takes the message's records out of its line's count (`app.admission.ledger`): the
   bound counts records, and a message holds its records until it is acked. A reject
   with a requeue keeps them counted: the message is back on its queue.

3. Keep a worker alive when Redis goes away under kombu: a failed restore or ack on a dead
or torn-down channel is logged and skipped instead of ending the consumer or the worker.

When the broker connection is lost, kombu closes the channel and tries to put the messages
the worker held back on their queues, over the connection that just died. The error it
raises there stops Celery's consumer from reconnecting: the worker stays up, consumes
nothing, and keeps its heartbeat (seen in the chaos test that kills Redis). Skipping that
restore loses nothing: the messages are still in Redis's unacked set (kombu returns them
after the visibility timeout) or were lost with Redis, and the journal re-enqueues those.

4. No health-check ping that waits on the event loop. The commands a worker sends between
   fetches (acks, kombu's binding refresh every second, Celery's heartbeat events) use
   connections that are replaced when idle past the interval (`app.config.redis`). The
   fetch and pub/sub connections are not checked before a command at all: a check there
   either waits out the socket timeout on a dead connection or, when it reconnects,
   leaves kombu waiting on the old socket and sending a second fetch. kombu watches those
   two itself (a fetch reply overdue, pings unanswered) and replaces them."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual

from app.admission.ledger import RELEASE, count_keys
from app.config.redis import replaced_when_idle
from app.telemetry.logs import get_logger

log = get_logger(__name__)

_restore_unacked = kombu_redis.QoS.restore_unacked


def _restore_unacked_or_skip(self: Any, client: Any = None) -> Any:
    try:
        return _restore_unacked(self, client)
    # AttributeError: kombu tore the connection down first (its client info is gone).
    except (redis.ConnectionError, redis.TimeoutError, OSError, AttributeError) as exc:
        log.warning("unacked_restore_skipped", held=len(self._delivered), error=str(exc))
        self._delivered.clear()
        return None


kombu_redis.QoS.restore_unacked = _restore_unacked_or_skip  # type: ignore[method-assign]


def _ack_or_skip(self: Any, delivery_tag: Any) -> Any:
    """kombu's ack (the message out of the unacked hash), and its records out of its
    line's count (`app.admission.ledger`), in one round trip. An ack on a channel kombu
    already tore down raises `AttributeError`, which Celery treats as unrecoverable and the
    worker exits. The message's record is journaled: if the ack is lost, the message comes
    back and its second run does nothing (and a lost release is found by the next scan)."""
    message = self._delivered.get(delivery_tag)
    queue = message.delivery_info.get("routing_key") if message is not None else None
    try:
        with self.pipe_or_acquire() as pipe:
            self._remove_from_indices(delivery_tag, pipe)
            if queue:
                keys = count_keys(queue)
                pipe.evalsha(_RELEASE_SHA, len(keys), *keys, delivery_tag)
            replies = pipe.execute(raise_on_error=False)
        if queue and isinstance(replies[-1], redis.exceptions.NoScriptError):
            with self.channel.conn_or_acquire() as client:
                client.eval(RELEASE, len(keys), *keys, delivery_tag)
    except (redis.ConnectionError, redis.TimeoutError, OSError, AttributeError) as exc:
        log.warning("ack_skipped", error=str(exc))
        return None
    return kombu_virtual.QoS.ack(self, delivery_tag)


_reject = kombu_redis.QoS.reject


def _reject_counted(self: Any, delivery_tag: Any, requeue: bool = False) -> Any:
    """A reject without a requeue is an ack (kombu's own is the same); with one, the message
    goes back on its queue and stays counted."""
    if not requeue:
        return _ack_or_skip(self, delivery_tag)
    return _reject(self, delivery_tag, requeue=True)


_RELEASE_SHA = hashlib.sha1(RELEASE.encode(), usedforsecurity=False).hexdigest()
kombu_redis.QoS.ack = _ack_or_skip  # type: ignore[method-assign]
kombu_redis.QoS.reject = _reject_counted  # type: ignore[method-assign]


@contextmanager
def _conn_or_acquire(self: Any, client: Any = None) -> Iterator[Any]:
    if client:
        yield client
        return
    pool = self.pool
    cached = self.__dict__.get("_pipeline_client")
    if cached is None or cached.connection_pool is not pool:
        cached = self._create_client()
        self.__dict__["_pipeline_client"] = cached
    yield cached


kombu_redis.Channel.conn_or_acquire = _conn_or_acquire  # type: ignore[method-assign]


_connparams = kombu_redis.Channel._connparams  # type: ignore[attr-defined]  # private


def _connparams_without_waiting_checks(self: Any, asynchronous: bool = False) -> Any:
    params = _connparams(self, asynchronous)
    base = params["connection_class"]
    if asynchronous:
        params["connection_class"] = type(
            "EventLoopConnection", (base,), {"check_health": _no_check}
        )
    else:
        params["connection_class"] = replaced_when_idle(base)
    return params


def _no_check(self: Any) -> None:
    """The fetch and pub/sub connections: kombu's event loop watches them (see above)."""


kombu_redis.Channel._connparams = _connparams_without_waiting_checks  # type: ignore[attr-defined]
