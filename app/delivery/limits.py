"""What a line's downstream may get, across every worker on every host: `delivery_rate`
(deliveries per second, a token bucket) and `delivery_concurrency` (deliveries in flight,
a lease per delivery), both in Redis, on Redis's clock.

A delivery takes a token and a slot just before its request goes out and gives the slot
back when its answer (or its timeout) comes. A slot whose worker died lapses after the
longest a delivery may take, so a killed worker never holds the line's slots for good."""

from __future__ import annotations

import contextlib
import math
import uuid
from dataclasses import dataclass

import redis

from app.errors import BrokerUnavailable
from app.line_settings import LineSettings

BUCKET_KEY = "pipeline:rate:{line}"
SLOTS_KEY = "pipeline:inflight:{line}"
# A bucket holds at most this share of a second's tokens: what it lets through in any
# second is `rate * (1 + BURST_SHARE)` at most, however long the line was idle.
BURST_SHARE = 0.1

# KEYS[1]: the bucket (a hash: tokens, at_ms). ARGV: rate per s, capacity.
# Returns {1, 0} when a token was taken, else {0, ms until the next one}.
_TAKE = """
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local rate, capacity = tonumber(ARGV[1]), tonumber(ARGV[2])
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens') or capacity)
local at_ms = tonumber(redis.call('HGET', KEYS[1], 'at_ms') or now_ms)
tokens = math.min(capacity, tokens + math.max(0, now_ms - at_ms) * rate / 1000)
local taken = 0
local wait_ms = 0
if tokens >= 1 then
  tokens = tokens - 1
  taken = 1
else
  wait_ms = math.ceil((1 - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at_ms', now_ms)
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity * 1000 / rate) + 1000)
return {taken, wait_ms}
"""

# KEYS[1]: the slots (a sorted set: member -> expiry ms). ARGV: limit, member, lifetime ms.
# Returns 1 when the slot was taken.
_ACQUIRE = """
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now_ms + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) + 1000)
return 1
"""

# How long a delivery waits between two asks for a slot.
SLOT_POLL_S = 0.005


@dataclass(frozen=True, kw_only=True)
class Grant:
    """What an ask got: a slot (its member, None when the line has no concurrency limit),
    or how long to wait before asking again (`wait_s` > 0: nothing was taken)."""

    slot: str | None = None
    wait_s: float = 0.0

    @property
    def granted(self) -> bool:
        return self.wait_s == 0.0


class DeliveryLimits:
    """The global limits of the lines' deliveries."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client
        self._take = client.register_script(_TAKE)
        self._acquire = client.register_script(_ACQUIRE)

    def ask(self, line: str, settings: LineSettings, *, lifetime_s: float) -> Grant:
        """Ask for one delivery of `line` now: a slot under `delivery_concurrency` (kept
        `lifetime_s` at most) and a token of `delivery_rate`. Nothing is taken unless both
        are: the answer then says how long to wait. Raises `BrokerUnavailable`."""
        try:
            slot = None
            if settings.delivery_concurrency is not None:
                slot = uuid.uuid4().hex
                got = self._acquire(
                    keys=[SLOTS_KEY.format(line=line)],
                    args=[settings.delivery_concurrency, slot, math.ceil(lifetime_s * 1000)],
                )
                if not got:
                    return Grant(wait_s=SLOT_POLL_S)
            if settings.delivery_rate is not None:
                rate = settings.delivery_rate
                taken, wait_ms = self._take(
                    keys=[BUCKET_KEY.format(line=line)], args=[rate, bucket_capacity(rate)]
                )
                if not taken:
                    if slot is not None:
                        self.release(line, slot)
                    return Grant(wait_s=max(0.001, int(wait_ms) / 1000))
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"the delivery limits of {line}: {exc}") from exc
        return Grant(slot=slot)

    def release(self, line: str, slot: str | None) -> None:
        """Give back a slot `ask` granted. A slot that cannot be given back lapses."""
        if slot is None:
            return
        with contextlib.suppress(redis.RedisError):  # else it lapses at its expiry
            self._redis.zrem(SLOTS_KEY.format(line=line), slot)

    def in_flight(self, line: str) -> int:
        """Deliveries of `line` holding a slot now (0 for a line without the limit)."""
        try:
            return int(self._redis.zcard(SLOTS_KEY.format(line=line)))
        except redis.RedisError:
            return 0


def bucket_capacity(rate: float) -> float:
    """The most tokens a bucket of `rate` per second holds: `BURST_SHARE` of a second's,
    and one at least."""
    return max(1.0, rate * BURST_SHARE)
