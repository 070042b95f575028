"""A line's circuit breaker, shared by every worker on every host through Redis (on
Redis's clock).

Closed, each delivery's outcome is counted in per-second buckets over the line's
`circuit_window_s`. When at least `circuit_min_attempts` were counted and most of them
failed (a 5xx or 429 answer, a timeout, no connection), the circuit opens: no delivery
starts but one probe at a time, one every `circuit_probe_interval_s`; the records wait as
`failed`, their next attempt pushed out, and their attempts are not spent. A delivery that
is delivered while the circuit is open (the probe, or one that started before it opened)
closes it, and the window starts again empty. An answer that refuses one record (a 4xx
but 429) says nothing of the downstream's health, either way: it is not counted, never
closes the circuit, and a probe that got one leaves the next probe free to go at once.

After a close the line's deliveries come back gradually (a ramp), not all that came due
during the outage at once into a downstream that has just recovered: `circuit_min_attempts`
in the first second, twice as many in each next one, for `RAMP_S`; a delivery past the
second's share waits for the next second without spending an attempt.

A downstream's `Retry-After` (on a 429 or 503) holds every delivery of the line, open or
closed, until it has passed: the outcomes' count keeps the latest end of one in the
circuit's hash, and the admission lets nothing go before it.

The worker asks for a chunk of deliveries at once (`admit`, `want`) and counts the
outcomes that ended together at once (`count_all`): one round trip each, on its event loop."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

import redis
import redis.asyncio as aioredis

from app.config.line_settings import LineSettings
from app.errors import BrokerUnavailable

CIRCUIT_KEY = "pipeline:circuit:{line}"
# How long the ramp after a close lasts: 8 doublings of the first second's share (2,560
# deliveries in its last second with the default share of 10), then no limit.
RAMP_S = 8
OK_KEY = "pipeline:circuit:{line}:ok"
FAILED_KEY = "pipeline:circuit:{line}:failed"


class Admission(StrEnum):
    """What the circuit lets a delivery do."""

    GO = "go"  # closed: deliver
    PROBE = "probe"  # open, and this delivery is its one probe
    WAIT = "wait"  # open: wait, without spending an attempt


class Waiting(StrEnum):
    """What deliveries the circuit does not let go wait for."""

    NOTHING = ""
    OPEN = "open"  # the circuit is open: its next probe
    RAMP = "ramp"  # it closed moments ago: the ramp's next second
    HOLD = "hold"  # the downstream asked to wait (Retry-After)


class State(StrEnum):
    CLOSED = "closed"
    OPEN = "open"


class Health(StrEnum):
    """What a delivery's outcome says of its downstream."""

    UP = "up"  # delivered (an answer among the line's delivered statuses)
    DOWN = "down"  # no answer (a timeout, no connection), a 5xx or a 429
    UNSAID = "unsaid"  # another answer: the downstream is up, and refused that one record


def health_of(*, delivered: bool, http_status: int | None) -> Health:
    """What a delivery that was (or was not) `delivered`, answered `http_status` (None:
    no answer), says of its downstream."""
    if delivered:
        return Health.UP
    return Health.DOWN if counts_against(http_status) else Health.UNSAID


class Change(StrEnum):
    """What an outcome did to the circuit."""

    NONE = "none"
    OPENED = "opened"
    CLOSED = "closed"


# KEYS: circuit, ok buckets, failed buckets. ARGV: 1 window s, 2 min attempts, 3 probe
# interval ms, 4 ramp ms, then for each outcome, in the order they ended: its health
# (up/down/unsaid), its owner (the probe's, or ""), and the ms its answer asked the line to
# wait (`Retry-After`, 0: none). Returns {change, state, failed in window, counted in window}.
_OUTCOMES = """
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local sec = now[1]
local window = tonumber(ARGV[1])
local interval, ramp = tonumber(ARGV[3]), tonumber(ARGV[4])
local existed = redis.call('EXISTS', KEYS[1]) == 1
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local change = 'none'
local ups, downs, hold = 0, 0, 0
for i = 5, #ARGV, 3 do
  local health, owner, asked = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if asked > hold then hold = asked end
  if state == 'open' then
    if health == 'up' then
      redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
      redis.call('HSET', KEYS[1], 'closed_ms', now_ms)
      redis.call('PEXPIRE', KEYS[1], ramp)
      existed, state, change = true, 'closed', 'closed'
    elseif owner ~= '' and redis.call('HGET', KEYS[1], 'probe') == owner then
      redis.call('HDEL', KEYS[1], 'probe', 'probe_until_ms')
      if health == 'down' then
        redis.call('HSET', KEYS[1], 'next_probe_ms', now_ms + interval)
      end
    end
  elseif health == 'up' then
    ups = ups + 1
  elseif health == 'down' then
    downs = downs + 1
  end
end
local counted, failed = 0, 0
if state == 'closed' and ups + downs > 0 then
  if ups > 0 then redis.call('HINCRBY', KEYS[2], sec, ups) end
  if downs > 0 then redis.call('HINCRBY', KEYS[3], sec, downs) end
  redis.call('EXPIRE', KEYS[2], window + 5)
  redis.call('EXPIRE', KEYS[3], window + 5)
  for i, key in ipairs({KEYS[2], KEYS[3]}) do
    local fields = redis.call('HGETALL', key)
    for j = 1, #fields, 2 do
      if tonumber(fields[j]) <= sec - window then
        redis.call('HDEL', key, fields[j])
      else
        counted = counted + tonumber(fields[j + 1])
        if i == 2 then failed = failed + tonumber(fields[j + 1]) end
      end
    end
  end
  if counted >= tonumber(ARGV[2]) and failed * 2 > counted then
    redis.call('DEL', KEYS[1])  -- a ramp's counts and lifetime with it: an open circuit stays
    redis.call('HSET', KEYS[1], 'state', 'open', 'opened_ms', now_ms,
               'next_probe_ms', now_ms + interval, 'failed', failed, 'counted', counted)
    existed, state, change = true, 'open', 'opened'
  end
end
if hold > 0 then
  local until_ms = now_ms + hold
  if until_ms > tonumber(redis.call('HGET', KEYS[1], 'hold_until_ms') or 0) then
    redis.call('HSET', KEYS[1], 'hold_until_ms', until_ms)
  end
  local ttl = redis.call('PTTL', KEYS[1])
  if not existed or (ttl >= 0 and ttl < hold) then redis.call('PEXPIRE', KEYS[1], hold) end
end
return {change, state, failed, counted}
"""

# KEYS: circuit. ARGV: 1 owner, 2 probe lifetime ms, 3 the ramp's first second's share,
# 4 ramp ms, 5 deliveries wanted. Returns {admission, deliveries granted, ms until the
# next probe (or the ramp's next second, or the end of a downstream's Retry-After), what
# the others wait for (open, ramp, hold, or "")}.
_ADMIT = """
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local want = tonumber(ARGV[5])
local hold = tonumber(redis.call('HGET', KEYS[1], 'hold_until_ms') or 0)
if hold > now_ms then return {'wait', 0, hold - now_ms, 'hold'} end
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then
  local closed = tonumber(redis.call('HGET', KEYS[1], 'closed_ms') or 0)
  local since = now_ms - closed
  if closed == 0 or since >= tonumber(ARGV[4]) then return {'go', want, 0, ''} end
  local sec = math.floor(since / 1000)
  local share = tonumber(ARGV[3]) * 2 ^ sec
  local taken = tonumber(redis.call('HGET', KEYS[1], 'ramp:' .. sec) or 0)
  local granted = math.max(0, math.min(want, share - taken))
  if granted == 0 then return {'wait', 0, 1000 - since % 1000, 'ramp'} end
  redis.call('HINCRBY', KEYS[1], 'ramp:' .. sec, granted)
  if granted < want then return {'go', granted, 1000 - since % 1000, 'ramp'} end
  return {'go', granted, 0, ''}
end
local probe_until = tonumber(redis.call('HGET', KEYS[1], 'probe_until_ms') or 0)
local next_probe = tonumber(redis.call('HGET', KEYS[1], 'next_probe_ms') or 0)
if probe_until > now_ms then
  return {'wait', 0, math.max(probe_until, next_probe) - now_ms, 'open'}
end
if now_ms >= next_probe then
  redis.call('HSET', KEYS[1], 'probe', ARGV[1], 'probe_until_ms', now_ms + tonumber(ARGV[2]))
  return {'probe', 1, 0, ''}
end
return {'wait', 0, next_probe - now_ms, 'open'}
"""

# KEYS: circuit. ARGV: 1 owner.
_DROP = """
if redis.call('HGET', KEYS[1], 'probe') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'probe', 'probe_until_ms')
end
return 1
"""


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The circuit's answer to deliveries about to start: go (`granted` of them; the
    others wait `wait_s`), probe (the first alone), or wait `wait_s`."""

    admission: Admission
    granted: int = 0
    wait_s: float = 0.0
    waiting: Waiting = Waiting.NOTHING


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What one delivery's outcome says to its line's circuit: its downstream's `health`,
    the probe's `owner` when it was one, and the seconds its answer asked the line to
    wait (`Retry-After`)."""

    health: Health
    owner: str = ""
    retry_after_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Counted:
    """What an outcome did: the change, and the state after it."""

    change: Change
    state: State
    failed: int = 0
    counted: int = 0


@dataclass(frozen=True, kw_only=True)
class CircuitState:
    """A line's circuit as `/v1/lines`, `/metrics` and the console show it."""

    state: State
    opened_at: datetime | None = None
    next_probe_at: datetime | None = None
    probing: bool = False

    def public(self) -> dict[str, object]:
        return {
            "state": self.state.value,
            "opened_at": self.opened_at.isoformat() if self.opened_at else None,
            "next_probe_at": self.next_probe_at.isoformat() if self.next_probe_at else None,
            "probing": self.probing,
        }


def counts_against(http_status: int | None) -> bool:
    """Whether a failed delivery says the downstream is failing: no answer (a timeout, no
    connection), a 5xx, or a 429. Another answer (a 4xx) is the downstream up and saying
    no to that record."""
    return http_status is None or http_status >= 500 or http_status == 429


class Circuits:
    """The circuits of the lines, as the attempt engine asks them: on its event loop, each
    ask one round trip, never a thread's wait."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._outcomes = client.register_script(_OUTCOMES)
        self._admit = client.register_script(_ADMIT)
        self._drop = client.register_script(_DROP)

    async def admit(
        self,
        line: str,
        settings: LineSettings,
        *,
        owner: str,
        probe_lifetime_s: float,
        want: int = 1,
    ) -> Verdict:
        """Whether `want` deliveries of `line` may start now, in one round trip. A probe is
        `owner`'s until its outcome is counted, or for `probe_lifetime_s` at most (its
        worker may die); in the ramp after a close, deliveries past the second's share
        wait; while a downstream's `Retry-After` runs, every delivery waits. Raises
        `BrokerUnavailable`."""
        try:
            admission, granted, wait_ms, waiting = await self._admit(
                keys=[CIRCUIT_KEY.format(line=line)],
                args=[
                    owner,
                    math.ceil(probe_lifetime_s * 1000),
                    settings.circuit_min_attempts,
                    RAMP_S * 1000,
                    want,
                ],
            )
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"the circuit of {line}: {exc}") from exc
        return Verdict(
            admission=Admission(_text(admission)),
            granted=int(granted),
            wait_s=int(wait_ms) / 1000,
            waiting=Waiting(_text(waiting)),
        )

    async def count_all(
        self, line: str, settings: LineSettings, outcomes: Sequence[Outcome]
    ) -> Counted:
        """Count what deliveries' outcomes, in the order they ended, say of the downstream,
        in one round trip; the circuit's change (the last) and its state after them. An
        answer's `Retry-After` holds every delivery of the line until it has passed.
        Raises `BrokerUnavailable`."""
        args: list[str | int] = [
            math.ceil(settings.circuit_window_s),
            settings.circuit_min_attempts,
            math.ceil(settings.circuit_probe_interval_s * 1000),
            RAMP_S * 1000,
        ]
        for outcome in outcomes:
            args += [outcome.health.value, outcome.owner, math.ceil(outcome.retry_after_s * 1000)]
        try:
            change, state, failed, counted = await self._outcomes(
                keys=[key.format(line=line) for key in (CIRCUIT_KEY, OK_KEY, FAILED_KEY)],
                args=args,
            )
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"the circuit of {line}: {exc}") from exc
        return Counted(
            change=Change(_text(change)),
            state=State(_text(state)),
            failed=int(failed),
            counted=int(counted),
        )

    async def drop_probe(self, line: str, owner: str) -> None:
        """`owner`'s probe did not go out (its record was not claimed, or found no room
        under the limits): the next delivery may probe. Raises `BrokerUnavailable` (the
        probe then lapses at its lifetime)."""
        try:
            await self._drop(keys=[CIRCUIT_KEY.format(line=line)], args=[owner])
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"the circuit of {line}: {exc}") from exc


class CircuitReader:
    """The lines' circuits as `/v1/lines`, `/metrics` and the console read them."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def state(self, line: str) -> CircuitState:
        """`line`'s circuit now. Raises `BrokerUnavailable`."""
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                pipe.hgetall(CIRCUIT_KEY.format(line=line))
                pipe.time()
                fields, (seconds, micros) = pipe.execute()
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"the circuit of {line}: {exc}") from exc
        found = {_text(k): _text(v) for k, v in fields.items()}
        if found.get("state") != State.OPEN:
            return CircuitState(state=State.CLOSED)
        # A probe is out until its outcome is counted, or past its lifetime (its worker
        # died, or its count was lost): on Redis's clock, as the admission judges it.
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        return CircuitState(
            state=State.OPEN,
            opened_at=_at(found.get("opened_ms")),
            next_probe_at=_at(found.get("next_probe_ms")),
            probing="probe" in found and int(found.get("probe_until_ms", 0)) > now_ms,
        )

    def open_among(self, lines: Iterable[str]) -> frozenset[str]:
        """Which of `lines` have their circuit open now (none when Redis does not answer:
        nothing can be said of them then)."""
        try:
            return frozenset(line for line in lines if self.state(line).state is State.OPEN)
        except BrokerUnavailable:
            return frozenset()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _at(ms: str | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(int(ms) / 1000, tz=UTC)
