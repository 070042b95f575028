"""One active beat: a Redis lock with a short TTL, renewed on its own thread.

`Renewer` renews the lock (or, standing by, tries to take it) every `renew_every_s`, on
its own thread: neither a slow fire nor a long maintenance run delays it. A standby takes
over within one TTL of the holder's death. The beat counts as holding the lock only until
one TTL after its last successful renewal was sent, so a renewal that hangs stops the
firing and the maintenance before another beat can take over; a renewal that fails (a
Redis blip) ends nothing sooner.

A failover (or a restart that lost the data) can lose the lock's last write: the promoted
replica never got it, so it has no key, while the beat that wrote it still counts on it for
up to one TTL. The lock's script answers with the server's run id too; a beat that takes the
lock from a server other than the one it last heard from becomes active only one TTL after
taking it, by when any beat that held the lock on the old server has stopped counting on it.
A beat that held the lock up to the change and takes it again keeps it without a pause: no
other beat could have counted on it meanwhile. Not covered: a beat whose first answer ever
comes from the new server (one started during the failover); it has no old server to
compare with."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

import redis

from app.clock import utcnow
from app.observe.health import LOCK_KEY
from app.telemetry.logs import get_logger
from app.threads import LoopThread

log = get_logger(__name__)

__all__ = ["LOCK_KEY", "BeatLock", "Renewer"]

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""

# Renew when we hold it; else take it if nobody does. Returns {state, holder, server}:
# state 1 = renewed, 2 = acquired, 0 = held by `holder`; server = the run id of the server
# that ran the script ("" if it would not tell).
_HOLD = """
local holder = redis.call('GET', KEYS[1])
local state = 0
if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    state = 1
elseif not holder then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    state = 2
    holder = ARGV[1]
end
local ok, info = pcall(redis.call, 'INFO', 'server')
local server = ''
if ok and type(info) == 'string' then
    server = string.match(info, 'run_id:(%x+)') or ''
end
return {state, holder, server}
"""


class BeatLock:
    """This beat's side of the lock. `hold` is called from one thread (the `Renewer`'s);
    `active_since` may be read from any."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.client = client
        self.ttl_s = ttl_s
        self.ttl_ms = int(ttl_s * 1000)
        self.identity = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._script = client.register_script(_HOLD)
        self._clock = clock
        self._wall_clock = wall_clock
        self._state = threading.Lock()
        self.held = False
        # Monotonic time until which the lock is ours for sure: one TTL after the last
        # renewal that succeeded was sent (Redis set its expiry later than that).
        self._valid_until_s = 0.0
        self._active_since: datetime | None = None
        self.last_other: str | None = None
        self.last_error: str | None = None
        # The run id of the server the last answer came from, and the monotonic time before
        # which a lock taken from another server is not counted on (see the module's doc).
        self.server: str | None = None
        self._fenced_until_s = 0.0

    def hold(self) -> tuple[bool, str | None]:
        """Renew or take the lock. Returns (held now, the holder we took over from, if this
        call was a takeover).

        A Redis error is no answer: the key may still be ours, so the lock stays held until
        one TTL after the last renewal that succeeded was sent, and lapses then. Only an
        answer that another beat holds it, or that lapse, ends the hold; `active_since` is
        kept across renewals that answer "still ours" only while the hold never ended."""
        sent_s = self._clock()
        try:
            state, holder, server = self._script(keys=[LOCK_KEY], args=[self.identity, self.ttl_ms])
        except redis.RedisError as exc:
            self.last_error = str(exc)
            held = self._keep_until_lapsed()
            log.warning("beat_lock_renewal_failed", error=str(exc), held=held)
            return held, None
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
        server_text = server.decode() if isinstance(server, bytes) else str(server)
        changed = bool(self.server and server_text and server_text != self.server)
        if server_text:
            self.server = server_text
        self._set(
            held=int(state) in (1, 2),
            sent_s=sent_s,
            acquired=int(state) == 2,
            server_changed=changed,
        )
        return self.held, took_over_from

    def _keep_until_lapsed(self) -> bool:
        """After a renewal with no answer: end the hold if it has lapsed; returns whether it
        is still held."""
        with self._state:
            if self.held and self._clock() >= self._valid_until_s:
                log.warning("beat_lock_lost", reason="no renewal answered for a TTL")
                self._end()
            return self.held

    def _set(self, *, held: bool, sent_s: float, acquired: bool, server_changed: bool) -> None:
        with self._state:
            if not held:
                self._end()
                return
            # "Still ours" after a lapse: this beat stopped firing in between, so what fell
            # due meanwhile was missed, as for a beat that has just taken the lock.
            lapsed = not self.held or self._clock() >= self._valid_until_s
            if acquired and server_changed and lapsed:
                # Taken from a server that may have lost another beat's hold: wait it out.
                self._fenced_until_s = sent_s + self.ttl_s
                log.warning(
                    "beat_lock_fenced_after_server_change",
                    identity=self.identity,
                    server=self.server,
                    wait_s=self.ttl_s,
                )
            self.held = True
            self._valid_until_s = sent_s + self.ttl_s
            if acquired or lapsed:
                fenced_s = max(0.0, self._fenced_until_s - self._clock())
                self._active_since = self._wall_clock() + timedelta(seconds=fenced_s)

    def _end(self) -> None:
        self.held = False
        self._valid_until_s = 0.0
        self._fenced_until_s = 0.0
        self._active_since = None

    def active_since(self) -> datetime | None:
        """When this beat took the lock it still holds for sure; None when it does not
        (standing by, lost, its last renewal older than the TTL, or taken from a new server
        less than one TTL ago)."""
        with self._state:
            now_s = self._clock()
            if self.held and self._fenced_until_s <= now_s < self._valid_until_s:
                return self._active_since
            return None

    def release(self) -> None:
        """Give the lock up (on a clean stop), if we hold it."""
        try:
            self.client.eval(_RELEASE, 1, LOCK_KEY, self.identity)
        except redis.RedisError:
            return


class Renewer:
    """Calls `lock.hold()` at once, then every `every_s`, on its own daemon thread, and
    hands each result to `on_result(held, took_over_from)`. An exception from either is
    logged and the next renewal comes on time."""

    def __init__(
        self,
        lock: BeatLock,
        *,
        every_s: float,
        on_result: Callable[[bool, str | None], None],
    ) -> None:
        self._lock = lock
        self._on_result = on_result
        # Whatever a renewal raised, renewing goes on (the loop logs it as
        # `beat_lock_renewal_crashed`): were this thread to end, the hold would lapse one
        # TTL later and the beat would stand by for good, silently.
        self._loop = LoopThread(
            self._renew,
            name="beat-lock",
            every_s=every_s,
            failed_event="beat_lock_renewal_crashed",
        )

    def start(self) -> None:
        self._loop.start()

    def _renew(self) -> None:
        held, took_over_from = self._lock.hold()
        self._on_result(held, took_over_from)

    def stop(self, *, timeout_s: float) -> bool:
        """Stop renewing; returns whether the thread has ended within `timeout_s` (a
        renewal under way may wait for Redis up to its socket timeout)."""
        return self._loop.stop(timeout_s=timeout_s)
