"""What a line's queue holds, in records: the count its bound is checked against, and the
scan that reads every message it holds.

A message of k records takes k of its line's bound. Two Redis keys per queue keep that
count beside the messages themselves:
- the *held* hash: each message's delivery tag → its record count, push time (ms), list
  and sender, written by the bounded push (`app.admission.push`) in the same script as
  the LPUSH;
- the *records* counter: the sum of the held hash, changed in the same steps, as are the
  counts per sender (`app.admission.senders`).

A message leaves the count when a worker acks it (or rejects it without a requeue: the
workers' kombu patch calls `RELEASE`), not when a worker takes it: the count is the records
waiting on the queue or held by a worker, all of them in Redis. Why it stays right:
- a flush, or a Redis that restarts empty, loses the counter with the messages: 0;
- a partial loss (a failover to a replica that lagged) loses a push's count with its
  messages, since one script wrote both and a replica applies a script's writes at once;
- kombu's requeues (a rejected message put back, a worker's held messages restored after
  the visibility timeout or at a soft shutdown) move a message without acking it: it is
  counted all along;
- a message acked by a hard time limit goes through the ack: released;
- what is left (a message removed by hand, an ack whose release was lost with its
  connection) is found by the lost-message check's scan: a held entry older than the scan
  whose message the scan did not see is forgotten (`FORGET`).

`scan` reads a queue's lists in slices (`SLICE` messages a call) and kombu's unacked
messages with HSCAN, before and after the lists, so a long queue never blocks Redis for
long and a message moving between the two while it reads is seen in one or the other."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis

from app.admission.senders import low_senders_key, queue_lists, senders_key
from app.errors import BrokerUnavailable

HELD_KEY = "pipeline:held:{queue}"
RECORDS_KEY = "pipeline:records:{queue}"
# kombu's Redis transport keeps a worker's delivered, unacked messages in this hash, as
# `[message, exchange, routing key]` by delivery tag (kombu.transport.redis.Channel.unacked_key).
UNACKED_KEY = "unacked"
# Messages a scan reads per call: a few milliseconds of Redis's time each (messages are
# about 1 KiB).
SLICE = 500

# A held entry is `<records>,<push time ms>,<list>,<sender>` (`<list>` 1 for the queue's low
# list: `app.admission.senders`); an entry of an older push has only the first two.
# Takes one entry's records out of the counts: the line's (KEYS[2]), its sender's (KEYS[3])
# and, on the low list, its sender's there (KEYS[4]).
_UNCOUNT = """
local function uncount(held)
    local n, at, low, sender = string.match(held, '^(%d+),(%d+),(%d),(.*)$')
    if not n then n = string.match(held, '^(%d+)') end
    n = tonumber(n)
    if sender then
        if redis.call('HINCRBY', KEYS[3], sender, -n) <= 0 then
            redis.call('HDEL', KEYS[3], sender)
        end
        if low == '1' and redis.call('HINCRBY', KEYS[4], sender, -n) <= 0 then
            redis.call('HDEL', KEYS[4], sender)
        end
    end
    return n
end
"""

# KEYS[1]: the held hash, KEYS[2]: the records counter, KEYS[3]: the senders' counts,
# KEYS[4]: their counts on the low list. ARGV[1]: a delivery tag. Takes the message's
# records out of the counts, once (a second release finds nothing).
RELEASE = (
    _UNCOUNT
    + """
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
local n = uncount(held)
if redis.call('DECRBY', KEYS[2], n) <= 0 then redis.call('DEL', KEYS[2]) end
return n
"""
)

# KEYS as RELEASE. ARGV[1]: a time in ms; ARGV[2..]: delivery tags a scan did not see.
# Releases those pushed before that time (a message pushed later may simply be newer than
# the scan). Returns the records released.
FORGET = (
    _UNCOUNT
    + """
local released = 0
for i = 2, #ARGV do
    local held = redis.call('HGET', KEYS[1], ARGV[i])
    if held then
        local at = string.match(held, '^%d+,(%d+)')
        if tonumber(at) < tonumber(ARGV[1]) then
            redis.call('HDEL', KEYS[1], ARGV[i])
            released = released + uncount(held)
        end
    end
end
if released > 0 and redis.call('DECRBY', KEYS[2], released) <= 0 then
    redis.call('DEL', KEYS[2])
end
return released
"""
)

# KEYS as RELEASE. Rebuilds the senders' counts (KEYS[3], KEYS[4]) from the held hash.
RECOUNT = """
local held = redis.call('HGETALL', KEYS[1])
local counts, lows = {}, {}
for i = 2, #held, 2 do
    local n, at, low, sender = string.match(held[i], '^(%d+),(%d+),(%d),(.*)$')
    if n then
        counts[sender] = (counts[sender] or 0) + tonumber(n)
        if low == '1' then lows[sender] = (lows[sender] or 0) + tonumber(n) end
    end
end
redis.call('DEL', KEYS[3], KEYS[4])
for sender, n in pairs(counts) do redis.call('HSET', KEYS[3], sender, n) end
for sender, n in pairs(lows) do redis.call('HSET', KEYS[4], sender, n) end
return 1
"""

_BODY = re.compile(rb'"body": ?"([A-Za-z0-9+/=]*)"')
_TAG = re.compile(rb'"delivery_tag": ?"([^"]*)"')


def held_key(queue: str) -> str:
    return HELD_KEY.format(queue=queue)


def records_key(queue: str) -> str:
    return RECORDS_KEY.format(queue=queue)


def count_keys(queue: str) -> list[str]:
    """The keys RELEASE and FORGET change, in their order."""
    return [held_key(queue), records_key(queue), senders_key(queue), low_senders_key(queue)]


def body_ids(body: bytes) -> list[str]:
    """The record ids a message's base64 body carries (its task argument: an id, or a list
    of them); none for a body that is not one of ours."""
    try:
        args = json.loads(base64.b64decode(body))[0][0]
    except (ValueError, TypeError, IndexError, KeyError):
        return []
    candidates = args if isinstance(args, list) else [args]
    return [c for c in candidates if isinstance(c, str)]


@dataclass(kw_only=True)
class QueueScan:
    """What one scan of a queue saw: the record ids and delivery tags of its messages,
    waiting or held by a worker, and the Redis time (ms) it began at."""

    began_ms: int
    ids: set[str] = field(default_factory=set)
    tags: set[str] = field(default_factory=set)

    def add(self, raw: bytes) -> None:
        body = _BODY.search(raw)
        if body is not None:
            self.ids.update(body_ids(body.group(1)))
        tag = _TAG.search(raw)
        if tag is not None:
            self.tags.add(tag.group(1).decode())


class Ledger:
    """A queue's count of records, and its scan (see the module)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._forget = client.register_script(FORGET)
        self._recount = client.register_script(RECOUNT)

    def records(self, queue: str) -> int:
        """Records waiting on `queue` or held by its workers. Raises `BrokerUnavailable`."""
        try:
            value = self._client.get(records_key(queue))
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"reading {queue!r}'s count failed: {exc}") from exc
        return int(value) if value is not None else 0

    def scan(self, queue: str) -> QueueScan:
        """Every message `queue` holds, waiting or delivered to a worker and not acked, read
        in slices (see the module). Raises `BrokerUnavailable`."""
        try:
            seconds, micros = self._client.time()
            seen = QueueScan(began_ms=int(seconds) * 1000 + int(micros) // 1000)
            self._scan_unacked(queue, seen)
            for listed in queue_lists(queue):
                start = 0
                while True:
                    chunk = self._client.lrange(listed, start, start + SLICE - 1)
                    for raw in chunk:
                        seen.add(raw if isinstance(raw, bytes) else raw.encode())
                    if len(chunk) < SLICE:
                        break
                    start += SLICE
            self._scan_unacked(queue, seen)
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"reading {queue!r} failed: {exc}") from exc
        return seen

    def _scan_unacked(self, queue: str, seen: QueueScan) -> None:
        for tag, raw in self._client.hscan_iter(UNACKED_KEY, count=SLICE):
            try:
                message, _exchange, routing_key = json.loads(raw)
            except (ValueError, TypeError):
                continue
            if routing_key != queue or not isinstance(message, dict):
                continue
            seen.ids.update(body_ids(str(message.get("body", "")).encode()))
            seen.tags.add(tag.decode() if isinstance(tag, bytes) else str(tag))

    def forget_unseen(self, queue: str, seen: QueueScan) -> int:
        """Take out of `queue`'s count the messages pushed before `seen` began that it did
        not see: they are gone. Returns the records taken out. Raises `BrokerUnavailable`."""
        try:
            counted = [
                tag.decode() if isinstance(tag, bytes) else str(tag)
                for tag, _held in self._client.hscan_iter(held_key(queue), count=SLICE)
            ]
            missing = [tag for tag in counted if tag not in seen.tags]
            released = 0
            for chunk in _chunks(missing, SLICE):
                keys = count_keys(queue)
                released += int(self._forget(keys=keys, args=[seen.began_ms, *chunk]))
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"recounting {queue!r} failed: {exc}") from exc
        return released

    def recount_senders(self, queue: str) -> bool:
        """Rebuild `queue`'s counts per sender from its held messages when their sum is not
        the line's count (every step changes both, so only a release that missed them can
        make them differ: an ack by a worker of a version without them). Whether it did.
        Reads every held entry, in one script, only then. Raises `BrokerUnavailable`."""
        try:
            with self._client.pipeline(transaction=True) as pipe:
                pipe.hvals(senders_key(queue))
                pipe.get(records_key(queue))
                counts, records = pipe.execute()
            if sum(int(n) for n in counts) == int(records or 0):
                return False
            self._recount(keys=count_keys(queue))
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"recounting {queue!r}'s senders failed: {exc}") from exc
        return True


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
