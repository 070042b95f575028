"""Records of a line waiting in the journal: what keeps new records from overtaking them.

Four Redis keys per queue:
- the *behind* key exists while records left out by a full queue wait in the journal
  (`deferred`, or `failed` and put back). Its value names the push that last left some. A
  push of new records (`Pusher.push(behind=True)`) pushes nothing while it exists: the new
  records are deferred too, behind the older ones.
- the *senders behind* hash names each sender some of whose records were left out at its
  part of the bound (`app.admission.senders`), by the push that last left some there: a
  push of new records pushes none of that sender's while it is there, and the other
  senders' as usual.
- the *leaving* set holds a token for each push that left records whose move in the journal
  is not committed yet (with an expiry, in case its process dies before it says so).
- the *turn* key, a lock: one pass (a sweep of the line, or the intake's drain) at a time
  claims and pushes the line's waiting records, so that two cannot push them out of order.

A pass that finds nothing left in the journal of the senders not behind removes the behind
key, and each sender behind of whose records it finds nothing left, that sender; unless a
push left records since the pass began (each is compared with its value when the pass
began) or a leaving move is still being committed."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import redis

from app.admission.senders import senders_key
from app.config.redis import as_text
from app.errors import BrokerUnavailable

BEHIND_KEY = "pipeline:behind:{queue}"
SENDERS_BEHIND_KEY = "pipeline:behind-senders:{queue}"
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

# KEYS[1]: the behind key, KEYS[2]: the leaving set, KEYS[3]: the senders behind. ARGV[1]:
# "1" when the pass found nothing waiting of the senders not behind (the behind key may
# go), ARGV[2]: the behind key's value read before the pass began ("" for none),
# ARGV[3..]: each sender behind then of whose records the pass found none waiting, and its
# value then. Each goes unless a push left records since the pass began (a new value), or
# a leaving move is not committed yet. Returns 1 when new records are all free to be pushed.
_SETTLE = """
local now = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now[1] * 1000 + math.floor(now[2] / 1000))
if redis.call('ZCARD', KEYS[2]) > 0 then return 0 end
for i = 3, #ARGV, 2 do
    if redis.call('HGET', KEYS[3], ARGV[i]) == ARGV[i + 1] then
        redis.call('HDEL', KEYS[3], ARGV[i])
    end
end
local current = redis.call('GET', KEYS[1])
if current and ARGV[1] == '1' and current == ARGV[2] then
    redis.call('DEL', KEYS[1])
    current = false
end
if current or redis.call('HLEN', KEYS[3]) > 0 then return 0 end
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""


@dataclass(frozen=True, kw_only=True)
class Mark:
    """What a pass read before it began: the behind key's value ("" when there was none)
    and each sender behind, with its value."""

    behind: str
    senders: dict[str, str] = field(default_factory=dict)


class Waiting:
    """The behind key, the leaving set and the pass lock of each queue (see the module)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._settle = client.register_script(_SETTLE)
        self._release = client.register_script(_RELEASE)

    def mark(self, queue: str) -> Mark:
        """The behind key's value and the senders behind now: what `settle` compares.
        Raises `BrokerUnavailable`."""
        try:
            with self._client.pipeline(transaction=True) as pipe:
                pipe.get(BEHIND_KEY.format(queue=queue))
                pipe.hgetall(SENDERS_BEHIND_KEY.format(queue=queue))
                value, senders = pipe.execute()
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"reading {queue!r}'s waiting mark failed: {exc}") from exc
        return Mark(
            behind="" if value is None else as_text(value),
            senders={as_text(k): as_text(v) for k, v in senders.items()},
        )

    def settle(
        self,
        queue: str,
        *,
        mark: Mark,
        line: bool = True,
        senders: Sequence[str] | None = None,
    ) -> bool:
        """Free new records of `queue` to be pushed, with the `mark` read before the pass
        began: the line's (`line`: the pass found nothing waiting of the senders not behind)
        and those of each of `senders` (behind, and the pass found nothing of theirs
        waiting; None: every sender of `mark`). Whether they are all free. Raises
        `BrokerUnavailable`."""
        keys = [
            BEHIND_KEY.format(queue=queue),
            LEAVING_KEY.format(queue=queue),
            SENDERS_BEHIND_KEY.format(queue=queue),
        ]
        done = mark.senders if senders is None else {s: mark.senders[s] for s in senders}
        pairs = [item for pair in done.items() for item in pair]
        args = ["1" if line else "0", mark.behind, *pairs]
        try:
            return bool(self._settle(keys=keys, args=args))
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"settling {queue!r} failed: {exc}") from exc

    def rooms_behind(self, queue: str, senders: Sequence[str], *, most: int) -> dict[str, int]:
        """How many more records each of `senders` may have on `queue` under its part
        (`most` records). Raises `BrokerUnavailable`."""
        if not senders:
            return {}
        try:
            counts = self._client.hmget(senders_key(queue), list(senders))
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"reading {queue!r}'s senders failed: {exc}") from exc
        return {s: max(0, most - int(c or 0)) for s, c in zip(senders, counts, strict=True)}

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
