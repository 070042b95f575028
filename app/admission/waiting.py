"""Records of a line waiting in the journal: what keeps new records from overtaking them.

Three Redis keys per queue:
- the *behind* key exists while records left out by a full queue wait in the journal
  (`deferred`, or `failed` and put back). Its value names the push that last left some. A
  push of new records (`Pusher.push(behind=True)`) pushes nothing while it exists: the new
  records are deferred too, behind the older ones.
- the *leaving* set holds a token for each push that left records whose move in the journal
  is not committed yet (with an expiry, in case its process dies before it says so).
- the *turn* key, a lock: one pass (a sweep of the line, or the intake's drain) at a time
  claims and pushes the line's waiting records, so that two cannot push them out of order.

A pass that finds nothing of the line left in the journal removes the behind key, unless a
push left records since the pass began or a leaving move is still being committed."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from app.config.redis import as_text
from app.errors import BrokerUnavailable

BEHIND_KEY = "pipeline:behind:{queue}"
LEAVING_KEY = "pipeline:leaving:{queue}"
TURN_KEY = "pipeline:turn:{queue}"

# A leaving move is committed within the journal's timeout (seconds); past this its token
# is dropped, so a process that died in between holds nothing up for long.
LEAVING_EXPIRY_MS = 30_000
# A pass's turn outlives any pass; it is released at the pass's end.
PASS_LOCK_MS = 30_000
# How long a pass waits for the one under way before it leaves the line to that one.
PASS_WAIT_S = 2.0
PASS_POLL_S = 0.01

# KEYS[1]: the behind key, KEYS[2]: the leaving set. ARGV[1]: the behind key's value read
# before the pass began ("" for none). Returns 1 when new records are free to be pushed.
_SETTLE = """
local now = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now[1] * 1000 + math.floor(now[2] / 1000))
if redis.call('ZCARD', KEYS[2]) > 0 then return 0 end
local current = redis.call('GET', KEYS[1])
if not current then return 1 end
if current ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""


class Waiting:
    """The behind key, the leaving set and the pass lock of each queue (see the module)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._settle = client.register_script(_SETTLE)
        self._release = client.register_script(_RELEASE)

    def mark(self, queue: str) -> str:
        """The behind key's value now ("" when there is none): what `settle` compares."""
        try:
            value = self._client.get(BEHIND_KEY.format(queue=queue))
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"reading {queue!r}'s waiting mark failed: {exc}") from exc
        return "" if value is None else as_text(value)

    def settle(self, queue: str, *, mark: str) -> bool:
        """Free new records of `queue` to be pushed: called by a pass that found nothing of
        the line waiting, with the `mark` read before it began. Whether they are free.
        Raises `BrokerUnavailable`."""
        keys = [BEHIND_KEY.format(queue=queue), LEAVING_KEY.format(queue=queue)]
        try:
            return bool(self._settle(keys=keys, args=[mark]))
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"settling {queue!r} failed: {exc}") from exc

    def keep_behind(self, queue: str) -> None:
        """Keep new records of `queue` behind those waiting in the journal until a pass
        finds none left (a resumed line: what waited while it was paused goes first).
        Raises `BrokerUnavailable`."""
        try:
            self._client.set(BEHIND_KEY.format(queue=queue), uuid.uuid4().hex)
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"keeping {queue!r} behind failed: {exc}") from exc

    def left_kept(self, queue: str, token: str | None) -> None:
        """The records a push left (its `PushResult.leaving`) are now where the journal
        keeps them (or stayed as they were). Never raises: the token expires anyway."""
        if token is None:
            return
        try:
            self._client.zrem(LEAVING_KEY.format(queue=queue), token)
        except redis.RedisError:
            return

    @contextmanager
    def one_pass(self, queue: str) -> Iterator[bool]:
        """Hold `queue`'s turn for the block; yields False (and holds nothing) when another
        pass kept it for `PASS_WAIT_S`. Raises `BrokerUnavailable`."""
        key, token = TURN_KEY.format(queue=queue), uuid.uuid4().hex
        deadline = time.monotonic() + PASS_WAIT_S
        try:
            while not self._client.set(key, token, nx=True, px=PASS_LOCK_MS):
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(PASS_POLL_S)
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"taking {queue!r}'s turn failed: {exc}") from exc
        try:
            yield True
        finally:
            with contextlib.suppress(redis.RedisError):  # it expires
                self._release(keys=[key], args=[token])
