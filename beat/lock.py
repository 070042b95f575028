"""One active beat: a Redis lock with a short TTL, renewed every tick.

A standby tries on every tick for as long as it runs, and takes over within one TTL of the
holder's death. A holder that cannot renew stops firing at once."""

from __future__ import annotations

import os
import socket
import uuid

import redis

from app.logs import get_logger

log = get_logger(__name__)

LOCK_KEY = "pipeline:beat:lock"

# Renew when we hold it; else take it if nobody does. Returns {state, holder}:
# state 1 = renewed, 2 = acquired, 0 = held by `holder`.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""

_HOLD = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, ARGV[1]}
end
if not holder then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return {2, ARGV[1]}
end
return {0, holder}
"""


class BeatLock:
    """This beat's side of the lock."""

    def __init__(self, client: redis.Redis, *, ttl_s: float) -> None:
        self.client = client
        self.ttl_ms = int(ttl_s * 1000)
        self.identity = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._script = client.register_script(_HOLD)
        self.held = False
        self.last_other: str | None = None
        self.last_error: str | None = None

    def hold(self) -> tuple[bool, str | None]:
        """Renew or take the lock. Returns (held now, the holder we took over from, if this
        call was a takeover). Any Redis error means not held."""
        try:
            state, holder = self._script(keys=[LOCK_KEY], args=[self.identity, self.ttl_ms])
        except redis.RedisError as exc:
            if self.held:
                log.warning("beat_lock_lost", error=str(exc))
            self.held = False
            self.last_error = str(exc)
            return False, None
        self.last_error = None
        holder_text = holder.decode() if isinstance(holder, bytes) else str(holder)
        took_over_from = None
        if int(state) == 2:
            took_over_from = self.last_other
            log.info("beat_lock_acquired", identity=self.identity, previous=took_over_from)
        elif int(state) == 0:
            if self.held:
                log.warning("beat_lock_lost", holder=holder_text)
            self.last_other = holder_text
        self.held = int(state) in (1, 2)
        return self.held, took_over_from

    def release(self) -> None:
        """Give the lock up (on a clean stop), if we hold it."""
        try:
            self.client.eval(_RELEASE, 1, LOCK_KEY, self.identity)
        except redis.RedisError:
            return
