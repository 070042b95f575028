"""What a line's downstream may get, across every worker on every host: `delivery_rate`
(deliveries per second, a token bucket) and `delivery_concurrency` (deliveries in flight,
a lease per delivery), both in Redis, on Redis's clock.

A worker takes tokens and slots for the records it is about to claim, in one round trip,
and gives a slot back once its delivery's answer (or its timeout) is counted. A slot whose
worker died lapses after the longest a delivery may take (the wait for room, the request's
deadline and a second), so a killed worker never holds the line's slots for good."""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis

from app.config.line_settings import LineSettings
from app.errors import BrokerUnavailable

BUCKET_KEY = "pipeline:rate:{line}"
SLOTS_KEY = "pipeline:inflight:{line}"
# A bucket holds at most this share of a second's tokens: what it lets through in any
# second is `rate * (1 + BURST_SHARE)` at most, however long the line was idle.
BURST_SHARE = 0.1

# KEYS: the bucket (a hash: tokens, at_ms), the slots (a sorted set: member -> expiry ms).
# ARGV: 1 deliveries wanted, 2 rate per s ("": none), 3 capacity, 4 concurrency ("": none),
# 5 slot lifetime ms, 6 the slots' member prefix. Returns {granted, ms to wait when none}.
_ASK = """
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local granted = tonumber(ARGV[1])
local wait_ms = 0
if ARGV[4] ~= '' then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
  local free = tonumber(ARGV[4]) - redis.call('ZCARD', KEYS[2])
  if free < granted then granted = math.max(0, free) end
  if granted == 0 then wait_ms = 5 end
end
local tokens, rate, capacity
if ARGV[2] ~= '' then
  rate, capacity = tonumber(ARGV[2]), tonumber(ARGV[3])
  tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens') or capacity)
  local at_ms = tonumber(redis.call('HGET', KEYS[1], 'at_ms') or now_ms)
  tokens = math.min(capacity, tokens + math.max(0, now_ms - at_ms) * rate / 1000)
  if math.floor(tokens) < granted then granted = math.floor(tokens) end
  if granted == 0 then wait_ms = math.max(wait_ms, math.ceil((1 - tokens) * 1000 / rate)) end
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens - granted), 'at_ms', now_ms)
  redis.call('PEXPIRE', KEYS[1], math.ceil(capacity * 1000 / rate) + 1000)
end
if ARGV[4] ~= '' then
  for i = 1, granted do
    redis.call('ZADD', KEYS[2], now_ms + tonumber(ARGV[5]), ARGV[6] .. i)
  end
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[5]) + 1000)
end
return {granted, wait_ms}
"""


@dataclass(frozen=True, kw_only=True)
class Grant:
    """What an ask got: `count` deliveries may start, holding `slots` (their members;
    empty when the line has no concurrency limit); when none may, `wait_s` says how long
    to wait before asking again."""

    count: int
    slots: tuple[str, ...] = ()
    wait_s: float = 0.0


class DeliveryLimits:
    """The global limits of the lines' deliveries, as the attempt engine asks them: on its
    event loop, each ask one round trip."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._ask = client.register_script(_ASK)

    async def ask(
        self, line: str, settings: LineSettings, *, want: int, lifetime_s: float
    ) -> Grant:
        """Ask for up to `want` deliveries of `line` now, in one round trip: as many as
        there are tokens of `delivery_rate` and slots under `delivery_concurrency` (each
        kept `lifetime_s` at most). Raises `BrokerUnavailable`."""
        limited = settings.delivery_concurrency is not None
        if settings.delivery_rate is None and not limited:
            return Grant(count=want)
        rate = settings.delivery_rate
        prefix = f"{uuid.uuid4().hex}:"
        try:
            granted, wait_ms = await self._ask(
                keys=[BUCKET_KEY.format(line=line), SLOTS_KEY.format(line=line)],
                args=[
                    want,
                    "" if rate is None else rate,
                    "" if rate is None else bucket_capacity(rate),
                    "" if settings.delivery_concurrency is None else settings.delivery_concurrency,
                    math.ceil(lifetime_s * 1000),
                    prefix,
                ],
            )
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"the delivery limits of {line}: {exc}") from exc
        count = int(granted)
        slots = tuple(f"{prefix}{i}" for i in range(1, count + 1)) if limited else ()
        return Grant(count=count, slots=slots, wait_s=int(wait_ms) / 1000)

    async def release(self, line: str, slots: Sequence[str]) -> None:
        """Give back slots `ask` granted, in one round trip. Raises `BrokerUnavailable`
        (the slots then lapse at their expiry)."""
        if not slots:
            return
        try:
            await self._redis.zrem(SLOTS_KEY.format(line=line), *slots)
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"the delivery limits of {line}: {exc}") from exc


def bucket_capacity(rate: float) -> float:
    """The most tokens a bucket of `rate` per second holds: `BURST_SHARE` of a second's,
    and one at least."""
    return max(1.0, rate * BURST_SHARE)
