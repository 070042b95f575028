"""Bounded admission: the atomic check-and-push onto a line's Redis queue.

We write exactly the message Celery's Redis transport writes (task protocol 2, JSON), with
one Lua script that checks the queue's length and pushes in the same step, so the bound
holds whatever the number of producers."""

from __future__ import annotations

import base64
import functools
import itertools
import json
import os
import re
import socket
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import redis
from opentelemetry.trace import Tracer

from app.admission.ledger import Ledger, held_key, records_key
from app.admission.push_spans import PushSpans
from app.admission.senders import (
    SenderShare,
    low_queue,
    low_senders_key,
    sender_shares,
    senders_key,
    waiting_messages,
)
from app.admission.waiting import (
    BEHIND_KEY,
    LEAVING_EXPIRY_MS,
    LEAVING_KEY,
    SENDERS_BEHIND_KEY,
    Waiting,
)
from app.config.line_settings import DEFAULT_FAIR_SHARE
from app.config.redis import as_text
from app.errors import BrokerUnavailable
from app.ids import UNNAMED
from app.telemetry.tracing import NO_TRACER

T = TypeVar("T")

# The one task every line's worker runs; its queue tells the line.
TASK_NAME = "pipeline.process"

# The epoch names one life of Redis's memory. It is created by the first push and lost with
# everything else when Redis restarts empty or is flushed; a record pushed in another epoch
# than the current one can no longer be on its queue. (Redis's run_id would miss a FLUSHALL,
# and would change on a restart that kept its data through the append-only file.)
EPOCH_KEY = "pipeline:epoch"

# KEYS[1]: the queue, KEYS[2]: the epoch key, KEYS[3]: the queue's behind key, KEYS[4]: its
# leaving set, KEYS[5]: its senders behind (`app.admission.waiting`), KEYS[6]: its held
# hash, KEYS[7]: its records counter (`app.admission.ledger`), KEYS[8]: its senders'
# counts, KEYS[9]: theirs on the low list, KEYS[10]: the low list (`app.admission.senders`).
# ARGV[1]: the bound in records, ARGV[2]: an epoch to use if none exists, ARGV[3]: "1" to
# push nothing while the behind key exists, nor a sender's records while it is behind,
# ARGV[4]: a token to record in the leaving set if records are left out ("" for none),
# ARGV[5]: its expiry in ms, ARGV[6]: a sender's fair share in records, ARGV[7]: the most
# records one sender may have on the line, ARGV[8..]: for each message in turn its delivery
# tag, its record count, its sender and itself.
# Messages are pushed in order while their records fit under the bound and under their
# sender's part of it; once one of a sender's messages is left out, so are its later ones
# (a sender's records keep their order), and once the bound leaves one out, so are all
# later ones (the line's). A sender left out at its part is marked behind; the line, when
# the bound left them out.
# Returns {messages pushed, records after, epoch, 1 if any was left out only to wait behind
# older records, "1"/"0" per message: pushed or not, the senders left out at their part}.
_PUSH_BOUNDED = """
local epoch = redis.call('GET', KEYS[2])
if not epoch then
    epoch = ARGV[2]
    redis.call('SET', KEYS[2], epoch)
end
local depth = tonumber(redis.call('GET', KEYS[7]) or '0')
local behind, line_behind = 0, 0
local room = tonumber(ARGV[1]) - depth
local keeps_order = ARGV[3] == '1'
if keeps_order and redis.call('EXISTS', KEYS[3]) == 1 then
    behind, line_behind = 1, 1
    room = 0
end
local share, most = tonumber(ARGV[6]), tonumber(ARGV[7])
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local pushed, records, full = 0, 0, false
local flags, left, at_part = {}, {}, {}
for i = 8, #ARGV, 4 do
    local n, sender = tonumber(ARGV[i + 1]), ARGV[i + 2]
    local take, why = false, nil
    if not full and not left[sender] then
        local fits = tonumber(redis.call('HGET', KEYS[8], sender) or '0') + n <= most
        if records + n > room then
            full, why = true, 'full'
        elseif not fits then
            at_part[#at_part + 1] = sender
            why = 'part'
        elseif keeps_order and redis.call('HEXISTS', KEYS[5], sender) == 1 then
            -- It would fit: it waits only to keep its sender's order.
            behind, why = 1, 'behind'
        else
            take = true
        end
    end
    if take then
        local had = redis.call('HINCRBY', KEYS[8], sender, n)
        local low = 0
        if had > share or redis.call('HEXISTS', KEYS[9], sender) == 1 then
            low = 1
            redis.call('HINCRBY', KEYS[9], sender, n)
            redis.call('LPUSH', KEYS[10], ARGV[i + 3])
        else
            redis.call('LPUSH', KEYS[1], ARGV[i + 3])
        end
        redis.call('HSET', KEYS[6], ARGV[i], n .. ',' .. now_ms .. ',' .. low .. ',' .. sender)
        pushed = pushed + 1
        records = records + n
        flags[#flags + 1] = '1'
    else
        left[sender] = left[sender] or why or 'full'
        flags[#flags + 1] = '0'
    end
end
if records > 0 then redis.call('INCRBY', KEYS[7], records) end
if ARGV[4] ~= '' and pushed < #flags then
    redis.call('ZADD', KEYS[4], now_ms + tonumber(ARGV[5]), ARGV[4])
    if full and line_behind == 0 then
        -- The bound left them out: newer records of the line must wait behind them.
        redis.call('SET', KEYS[3], ARGV[4])
    end
    for sender, why in pairs(left) do
        if why == 'part' then
            -- Left out at its part: its newer records wait behind them.
            redis.call('HSET', KEYS[5], sender, ARGV[4])
        end
    end
end
return {pushed, depth + records, epoch, behind, table.concat(flags), at_part}
"""

_CURRENT_EPOCH = """
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
"""


@dataclass(frozen=True, kw_only=True)
class PushResult:
    """How many of the records went onto the queue (`pushed`; which ones: `taken`, one
    flag per record), the queue's depth in records after, the
    epoch they were pushed in, and whether some were left out only to wait behind older
    records in the journal (`behind`: the line's, or their sender's). `at_part`: the
    senders some of whose records were left out at their part of the bound. `leaving`: the
    token to give `Waiting.left_kept` once the records left out are kept in the journal."""

    pushed: int
    depth: int
    epoch: str
    behind: bool = False
    leaving: str | None = None
    taken: tuple[bool, ...] = ()
    at_part: tuple[str, ...] = ()

    def split(self, items: Sequence[T]) -> tuple[list[T], list[T]]:
        """`items` (one per record pushed, in order) cut into those pushed and those left
        out, each in order."""
        pushed = [item for item, taken in zip(items, self.taken, strict=True) if taken]
        left = [item for item, taken in zip(items, self.taken, strict=True) if not taken]
        return pushed, left


# The message header that carries a traceparent per traced record of the message,
# `{record id: traceparent}` (`app.telemetry.tracing`); absent when none is traced.
TRACEPARENTS_HEADER = "traceparents"


@functools.lru_cache(maxsize=256)
def _template(queue: str, origin: str, task: str, traced: bool = False) -> str:
    """The JSON text of `build_message`'s message with a placeholder for each per-record
    part (body, id, argsrepr, kwargsrepr, delivery tag, and the traceparents if `traced`)."""
    message: dict[str, object] = {
        "body": "\x00BODY\x00",
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": task,
            "id": "\x00ID\x00",
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": "\x00ID\x00",
            "parent_id": None,
            "argsrepr": "\x00ARGSREPR\x00",
            "kwargsrepr": "\x00KWARGSREPR\x00",
            "origin": origin,
            "ignore_result": True,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": "\x00ID\x00",
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": "\x00TAG\x00",
        },
    }
    if traced:
        # Last, where Celery's publisher puts the headers given to `apply_async`.
        headers = message["headers"]
        assert isinstance(headers, dict)
        headers[TRACEPARENTS_HEADER] = "\x00TRACES\x00"
    return json.dumps(message)


_BODY_TAIL = ', {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]'
_PLACEHOLDER = "\\u0000"


def build_message(
    record_ids: str | Sequence[str],
    *,
    queue: str,
    origin: str,
    task: str = TASK_NAME,
    business_nos: str | Sequence[str] | None = None,
    traceparents: Mapping[str, str] | None = None,
    tag: str | None = None,
) -> bytes:
    """The Celery task message for one record id, or for a batch of them, as kombu's Redis
    transport stores it (task protocol 2, JSON). The task's argument is the id, or the list
    of ids; its task id is the (first) record's id. Built from a template made once per
    (queue, origin, task).

    Its `kwargsrepr` (what Celery's task events, and so Flower, show as the task's keyword
    arguments; the task takes none) names the line and the records' business numbers
    (`business_nos`, one per id, when given), so that Flower's task list finds a task by
    them: `kwargs:business_no=B-1`.

    `traceparents`: the W3C traceparent of each traced record of the message, by record
    id, carried in the `traceparents` header (left out when None or empty). `tag`: its
    delivery tag (`new_delivery_tag()` when None)."""
    arg = record_ids if isinstance(record_ids, str) else list(record_ids)
    values = {
        "BODY": '"' + base64.b64encode(f"[[{json.dumps(arg)}]{_BODY_TAIL}".encode()).decode() + '"',
        "ID": json.dumps(record_ids if isinstance(record_ids, str) else record_ids[0]),
        "ARGSREPR": json.dumps(repr([arg])),
        "KWARGSREPR": json.dumps(labels_repr(queue, business_nos)),
        "TAG": f'"{tag or new_delivery_tag()}"',
    }
    if traceparents:
        values["TRACES"] = json.dumps(dict(traceparents))
    texts, names = _template_parts(queue, origin, task, bool(traceparents))
    out = [texts[0]]
    for name, text in zip(names, texts[1:], strict=True):
        out += (values[name], text)
    return "".join(out).encode()


# The longest list of business numbers a message's kwargsrepr carries, in characters
# (Celery cuts the argsrepr it writes itself at 1024: `app.amqp.argsrepr_maxsize`).
MAX_LABELS_REPR = 1024


def labels_repr(line: str, business_nos: str | Sequence[str] | None) -> str:
    """A message's kwargsrepr: `{'line': …, 'business_no': …}` (a list of them for a batch,
    cut to `MAX_LABELS_REPR` characters, with the count left out as `more`)."""
    if business_nos is None:
        return repr({"line": line})
    if isinstance(business_nos, str):
        return repr({"line": line, "business_no": business_nos})
    kept: list[str] = []
    size = 0
    for business_no in business_nos:
        size += len(business_no) + 4  # its quotes, comma and space
        if size > MAX_LABELS_REPR:
            break
        kept.append(business_no)
    labels: dict[str, object] = {"line": line, "business_no": kept}
    if len(kept) < len(business_nos):
        labels["more"] = len(business_nos) - len(kept)
    return repr(labels)


@functools.lru_cache(maxsize=256)
def _template_parts(
    queue: str, origin: str, task: str, traced: bool
) -> tuple[list[str], list[str]]:
    """`_template` cut at its placeholders: the texts between them, and their names."""
    pieces = re.split(
        f'"{re.escape(_PLACEHOLDER)}([A-Z]+){re.escape(_PLACEHOLDER)}"',
        _template(queue, origin, task, traced),
    )
    return pieces[0::2], pieces[1::2]


# Delivery tags: unique per message while it is in flight (kombu keys its unacked
# messages by them). A random prefix per process and a counter: a uuid4 per message was
# a third of the cost of building one.
_tags: tuple[int, str, Iterator[int]] | None = None


def new_delivery_tag() -> str:
    """A delivery tag no other message in flight has."""
    global _tags  # noqa: PLW0603 - one tag sequence per process
    if _tags is None or _tags[0] != os.getpid():  # a forked child starts its own
        _tags = (os.getpid(), uuid.uuid4().hex, itertools.count())
    return f"{_tags[1]}-{next(_tags[2])}"


def batches(
    record_ids: Sequence[str], size: int, senders: Sequence[str] | None = None
) -> list[str | list[str]]:
    """`record_ids` in order, as message arguments: each id alone when `size` is 1, else
    lists of up to `size` ids, a list never holding two senders' records (`senders`, one
    per id, when given). (Any sequence is cut the same way: business numbers too.)"""
    if size <= 1:
        return list(record_ids)
    cuts = [
        i for i in range(1, len(record_ids)) if senders is not None and senders[i] != senders[i - 1]
    ]
    out: list[str | list[str]] = []
    for start, end in itertools.pairwise([0, *cuts, len(record_ids)]):
        out += [list(record_ids[i : min(i + size, end)]) for i in range(start, end, size)]
    return out


class Pusher:
    """Pushes records onto their line's queue, never past its bound."""

    def __init__(self, client: redis.Redis, *, tracer: Tracer = NO_TRACER) -> None:
        self._client = client
        self._tracer = tracer
        self._script = client.register_script(_PUSH_BOUNDED)
        self._epoch_script = client.register_script(_CURRENT_EPOCH)
        self.waiting = Waiting(client)
        self.ledger = Ledger(client)
        self._origin = f"{os.getpid()}@{socket.gethostname()}"

    def push(  # noqa: PLR0913 - keyword-only: the records' sequences and the push's options
        self,
        queue: str,
        record_ids: Sequence[str],
        *,
        max_length: int,
        batch_size: int = 1,
        behind: bool = False,
        keeps_left: bool = False,
        senders: Sequence[str] | None = None,
        fair_share: int = DEFAULT_FAIR_SHARE,
        sender_max: int | None = None,
        business_nos: Sequence[str] | None = None,
        traceparents: Sequence[str | None] | None = None,
    ) -> PushResult:
        """Push the messages of `record_ids` onto `queue`, `batch_size` records to a
        message, in order while their records fit: the queue never holds more than
        `max_length` records (`app.admission.ledger`), nor one sender more than
        `sender_max` of them. `pushed` counts records, `taken` says which (see
        `PushResult.split`): a sender at its part is left out from its first message left
        out, the line from the first message the bound leaves out.

        `behind`: new records, which push nothing while older ones of the line wait in the
        journal, nor a sender's while older ones of that sender wait there.
        `keeps_left`: the caller keeps what is not pushed in the journal, to be pushed later
        (`deferred`, `failed`): newer records (of the line when the bound left them out, of
        their sender otherwise) then wait behind it, and the caller gives `leaving` to
        `self.waiting.left_kept` once its journal says so. `senders`: each record's sender
        (`Record.sender`; all `UNNAMED` when None): a message carries one sender's records,
        and goes on the queue's low list once its sender has more than `fair_share` records
        on the line.
        `business_nos`: the records' business numbers, in the order of `record_ids`, which
        each message names beside its line (see `build_message`). `traceparents`: the
        records' traceparents, in that order (None for an untraced one): with tracing on,
        each traced record gets a push span, child of its traceparent, which its message
        carries (see `app.admission.push_spans`).

        Raises `BrokerUnavailable` when Redis cannot be reached."""
        if not record_ids:
            return PushResult(pushed=0, depth=self.depth(queue), epoch=self.epoch())
        args = batches(record_ids, batch_size, senders)
        labels = batches(business_nos, batch_size, senders) if business_nos is not None else None
        sizes = [1 if isinstance(arg, str) else len(arg) for arg in args]
        firsts = list(itertools.accumulate(sizes, initial=0))[: len(args)]
        of_message = [UNNAMED if senders is None else senders[i] for i in firsts]
        spans = PushSpans(
            self._tracer, queue=queue, record_ids=record_ids, traceparents=traceparents
        )
        messages: list[str | int | bytes] = []
        for n, arg in enumerate(args):
            tag = new_delivery_tag()
            message = build_message(
                arg,
                queue=queue,
                origin=self._origin,
                business_nos=labels[n] if labels is not None else None,
                traceparents=spans.of(arg),
                tag=tag,
            )
            messages += (tag, 1 if isinstance(arg, str) else len(arg), of_message[n], message)
        token = uuid.uuid4().hex if keeps_left else ""
        try:
            pushed, depth, epoch, waiting, flags, at_part = self._script(
                keys=[
                    queue,
                    EPOCH_KEY,
                    BEHIND_KEY.format(queue=queue),
                    LEAVING_KEY.format(queue=queue),
                    SENDERS_BEHIND_KEY.format(queue=queue),
                    held_key(queue),
                    records_key(queue),
                    senders_key(queue),
                    low_senders_key(queue),
                    low_queue(queue),
                ],
                args=[
                    max_length,
                    str(uuid.uuid4()),
                    "1" if behind else "0",
                    token,
                    LEAVING_EXPIRY_MS,
                    fair_share,
                    max_length if sender_max is None else sender_max,
                    *messages,
                ],
            )
        except redis.RedisError as exc:
            failed = [False] * len(record_ids)
            spans.finish(record_ids, pushed=failed, error=f"{type(exc).__name__}: {exc}")
            raise BrokerUnavailable(f"push to {queue!r} failed: {exc}") from exc
        taken = tuple(
            flag == "1"
            for flag, size in zip(as_text(flags), sizes, strict=True)
            for _ in range(size)
        )
        spans.finish(record_ids, pushed=taken)
        return PushResult(
            pushed=sum(taken),
            depth=int(depth),
            epoch=as_text(epoch),
            behind=bool(waiting),
            leaving=token if token and int(pushed) < len(args) else None,
            taken=taken,
            at_part=tuple(dict.fromkeys(as_text(sender) for sender in at_part)),
        )

    def epoch(self) -> str:
        """The current epoch (made now if Redis has none). Raises `BrokerUnavailable`."""
        try:
            return as_text(self._epoch_script(keys=[EPOCH_KEY], args=[str(uuid.uuid4())]))
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"reading the epoch failed: {exc}") from exc

    def depth(self, queue: str) -> int:
        """Records on `queue`, waiting or held by its workers. Raises `BrokerUnavailable`."""
        return self.ledger.records(queue)

    def senders(self, queue: str) -> list[SenderShare]:
        """The senders with records on `queue`, busiest first, the rest summed as `other`
        (`sender_shares`). Raises `BrokerUnavailable`."""
        return sender_shares(self._client, queue)

    def messages(self, queue: str) -> int:
        """Messages waiting in `queue` (its two lists). Raises `BrokerUnavailable`."""
        try:
            return waiting_messages(self._client, queue)
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"LLEN {queue!r} failed: {exc}") from exc
