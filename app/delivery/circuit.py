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
second's share waits for the next second without spending an attempt."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

import redis

from app.errors import BrokerUnavailable
from app.line_settings import LineSettings

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


# KEYS: circuit, ok buckets, failed buckets. ARGV: 1 health (up/down/unsaid), 2 window s,
# 3 min attempts, 4 probe interval ms, 5 owner (the probe's, or ""), 6 ramp ms.
# Returns {change, state, failed in window, counted in window}.
_OUTCOME = """
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local sec = now[1]
local health = ARGV[1]
local ok = health == 'up'
local window = tonumber(ARGV[2])
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state == 'open' then
  if ok then
    redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
    redis.call('HSET', KEYS[1], 'closed_ms', now_ms)
    redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[6]))
    return {'closed', 'closed', 0, 0}
  end
  if ARGV[5] ~= '' and redis.call('HGET', KEYS[1], 'probe') == ARGV[5] then
    redis.call('HDEL', KEYS[1], 'probe', 'probe_until_ms')
    if health == 'down' then
      redis.call('HSET', KEYS[1], 'next_probe_ms', now_ms + tonumber(ARGV[4]))
    end
  end
  return {'none', 'open', 0, 0}
end
if health == 'unsaid' then return {'none', 'closed', 0, 0} end
redis.call('HINCRBY', ok and KEYS[2] or KEYS[3], sec, 1)
redis.call('EXPIRE', KEYS[2], window + 5)
redis.call('EXPIRE', KEYS[3], window + 5)
local counted, failed = 0, 0
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
if counted >= tonumber(ARGV[3]) and failed * 2 > counted then
  redis.call('DEL', KEYS[1])  -- a ramp's counts and lifetime with it: an open circuit stays
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened_ms', now_ms,
             'next_probe_ms', now_ms + tonumber(ARGV[4]), 'failed', failed, 'counted', counted)
  return {'opened', 'open', failed, counted}
end
return {'none', 'closed', failed, counted}
"""

# KEYS: circuit. ARGV: 1 owner, 2 probe lifetime ms, 3 the ramp's first second's share,
# 4 ramp ms. Returns {admission, ms until the next probe (or the ramp's next second)}.
_ADMIT = """
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then
  local closed = tonumber(redis.call('HGET', KEYS[1], 'closed_ms') or 0)
  local since = now_ms - closed
  if closed == 0 or since >= tonumber(ARGV[4]) then return {'go', 0} end
  local sec = math.floor(since / 1000)
  local taken = redis.call('HINCRBY', KEYS[1], 'ramp:' .. sec, 1)
  if taken > tonumber(ARGV[3]) * 2 ^ sec then return {'wait', 1000 - since % 1000} end
  return {'go', 0}
end
local probe_until = tonumber(redis.call('HGET', KEYS[1], 'probe_until_ms') or 0)
local next_probe = tonumber(redis.call('HGET', KEYS[1], 'next_probe_ms') or 0)
if probe_until > now_ms then return {'wait', math.max(probe_until, next_probe) - now_ms} end
if now_ms >= next_probe then
  redis.call('HSET', KEYS[1], 'probe', ARGV[1], 'probe_until_ms', now_ms + tonumber(ARGV[2]))
  return {'probe', 0}
end
return {'wait', next_probe - now_ms}
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
    """The circuit's answer to a delivery about to start: go, probe, or wait `wait_s`."""

    admission: Admission
    wait_s: float = 0.0


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
    """The circuits of the lines."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client
        self._outcome = client.register_script(_OUTCOME)
        self._admit = client.register_script(_ADMIT)
        self._drop = client.register_script(_DROP)

    def admit(
        self, line: str, settings: LineSettings, *, owner: str, probe_lifetime_s: float
    ) -> Verdict:
        """Whether a delivery of `line` may start now. A probe is `owner`'s until its
        outcome is counted, or for `probe_lifetime_s` at most (its worker may die); in
        the ramp after a close, a delivery past its second's share waits. Raises
        `BrokerUnavailable`."""
        try:
            admission, wait_ms = self._admit(
                keys=[CIRCUIT_KEY.format(line=line)],
                args=[
                    owner,
                    math.ceil(probe_lifetime_s * 1000),
                    settings.circuit_min_attempts,
                    RAMP_S * 1000,
                ],
            )
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"the circuit of {line}: {exc}") from exc
        return Verdict(admission=Admission(_text(admission)), wait_s=int(wait_ms) / 1000)

    def count(
        self, line: str, settings: LineSettings, *, health: Health, owner: str = ""
    ) -> Counted:
        """Count what a delivery's outcome says of the downstream (`owner`: the probe's,
        when it was one). Raises `BrokerUnavailable`."""
        try:
            change, state, failed, counted = self._outcome(
                keys=[key.format(line=line) for key in (CIRCUIT_KEY, OK_KEY, FAILED_KEY)],
                args=[
                    health.value,
                    math.ceil(settings.circuit_window_s),
                    settings.circuit_min_attempts,
                    math.ceil(settings.circuit_probe_interval_s * 1000),
                    owner,
                    RAMP_S * 1000,
                ],
            )
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"the circuit of {line}: {exc}") from exc
        return Counted(
            change=Change(_text(change)),
            state=State(_text(state)),
            failed=int(failed),
            counted=int(counted),
        )

    def drop_probe(self, line: str, owner: str) -> None:
        """`owner`'s probe did not go out (its record was not claimed, or found no room
        under the limits): the next delivery may probe. Never raises."""
        with contextlib.suppress(redis.RedisError):
            self._drop(keys=[CIRCUIT_KEY.format(line=line)], args=[owner])

    def state(self, line: str) -> CircuitState:
        """`line`'s circuit now. Raises `BrokerUnavailable`."""
        try:
            fields = self._redis.hgetall(CIRCUIT_KEY.format(line=line))
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"the circuit of {line}: {exc}") from exc
        found = {_text(k): _text(v) for k, v in fields.items()}
        if found.get("state") != State.OPEN:
            return CircuitState(state=State.CLOSED)
        return CircuitState(
            state=State.OPEN,
            opened_at=_at(found.get("opened_ms")),
            next_probe_at=_at(found.get("next_probe_ms")),
            probing="probe" in found,
        )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _at(ms: str | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(int(ms) / 1000, tz=UTC)
