"""Fair shares within a line: a sender's flood never starves another sender's records.

A line takes records from many senders (each intake key id is one; the pipeline's own
fires are `schedule`, dev mode's unsigned requests `dev`). Its queue is two Redis lists,
both kombu's own: the queue itself, and its lowest-priority list (`<queue>\\x06\\x169`),
which kombu's consumer reads only while the queue itself is empty. The bounded push
(`app.admission.push`) puts each message on one of them, in the same script:
- on the queue itself while its sender has no more than the line's `fair_share` records
  on the line (waiting or held by a worker) once the message is counted;
- on the low list past that, and for as long as the sender has records there, so that a
  sender's records are still taken in the order they were pushed.

So a sender within its share waits behind at most every other sender's share (and what
the workers prefetched), however many records a flooding sender has queued: those wait on
the low list, in arrival order. The Celery worker stays a plain consumer of its line's
queue (kombu reads a queue's priority lists itself). A message kombu restores (held by
a worker that stopped) goes back on the queue itself, ahead of its sender's newer records:
its entry still counts it on the low list, so those newer records stay behind it.

Two hashes per queue keep the counts, changed in the same scripts as the line's record
count (`app.admission.ledger`): the records of each sender on the line, and those of each
sender on the low list. A held message's entry names its sender and list, so its ack takes
its records out of both."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from app.config.redis import as_text
from app.errors import BrokerUnavailable
from app.ids import OTHER_SENDERS

SENDERS_KEY = "pipeline:senders:{queue}"
LOW_SENDERS_KEY = "pipeline:senders-low:{queue}"
# kombu's Redis transport names a queue's priority lists `<queue><sep><priority>`; 9 is the
# last its consumer reads (its default steps are 0, 3, 6, 9).
PRIORITY_SEPARATOR = "\x06\x16"
LOW_PRIORITY = 9
# The senders `/v1/lines` and `/metrics` name one by one; the rest are summed as `other`.
TOP_SENDERS = 10


def senders_key(queue: str) -> str:
    return SENDERS_KEY.format(queue=queue)


def low_senders_key(queue: str) -> str:
    return LOW_SENDERS_KEY.format(queue=queue)


def low_queue(queue: str) -> str:
    """The queue's lowest-priority list, where records past their sender's share wait."""
    return f"{queue}{PRIORITY_SEPARATOR}{LOW_PRIORITY}"


def queue_lists(queue: str) -> tuple[str, str]:
    """The queue's two lists, in the order its workers read them."""
    return queue, low_queue(queue)


def waiting_messages(client: redis.Redis, queue: str) -> int:
    """Messages waiting on `queue`'s two lists (not those its workers hold). Raises
    `redis.RedisError`."""
    with client.pipeline(transaction=False) as pipe:
        for listed in queue_lists(queue):
            pipe.llen(listed)
        return sum(int(n) for n in pipe.execute())


@dataclass(frozen=True, kw_only=True)
class SenderShare:
    """One sender's records on a line (waiting or held by a worker), and how many of them
    wait past its share, on the low list."""

    sender: str
    records: int
    past_share: int = 0


def sender_shares(client: redis.Redis, queue: str, *, top: int = TOP_SENDERS) -> list[SenderShare]:
    """The senders with records on `queue`, most records first: the first `top` by name,
    the rest summed as one `other` (so a caller's labels stay few however many senders
    there are). Raises `BrokerUnavailable`."""
    try:
        with client.pipeline(transaction=False) as pipe:
            pipe.hgetall(senders_key(queue))
            pipe.hgetall(low_senders_key(queue))
            counts, lows = pipe.execute()
    except redis.RedisError as exc:
        raise BrokerUnavailable(f"reading {queue!r}'s senders failed: {exc}") from exc
    low = {as_text(k): int(v) for k, v in lows.items()}
    shares = sorted(
        (
            SenderShare(sender=as_text(k), records=int(v), past_share=low.get(as_text(k), 0))
            for k, v in counts.items()
            if int(v) > 0
        ),
        key=lambda share: (-share.records, share.sender),
    )
    if len(shares) <= top:
        return shares
    rest = shares[top:]
    other = SenderShare(
        sender=OTHER_SENDERS,
        records=sum(s.records for s in rest),
        past_share=sum(s.past_share for s in rest),
    )
    return [*shares[:top], other]
