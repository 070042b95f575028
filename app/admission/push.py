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

import redis
from opentelemetry.trace import Tracer

from app.admission.ledger import Ledger, held_key, records_key
from app.admission.push_spans import PushSpans
from app.admission.senders import (
    UNNAMED,
    SenderShare,
    low_queue,
    low_senders_key,
    sender_shares,
    senders_key,
    waiting_messages,
)
from app.admission.waiting import BEHIND_KEY, LEAVING_EXPIRY_MS, LEAVING_KEY, Waiting
from app.config.line_settings import DEFAULT_FAIR_SHARE
from app.config.redis import as_text
from app.errors import BrokerUnavailable
from app.telemetry.tracing import NO_TRACER

# The one task every line's worker runs; its queue tells the line.
TASK_NAME = "pipeline.process"

# The epoch names one life of Redis's memory. It is created by the first push and lost with
# everything else when Redis restarts empty or is flushed; a record pushed in another epoch
# than the current one can no longer be on its queue. (Redis's run_id would miss a FLUSHALL,
# and would change on a restart that kept its data through the append-only file.)
EPOCH_KEY = "pipeline:epoch"

# KEYS[1]: the queue, KEYS[2]: the epoch key, KEYS[3]: the queue's behind key, KEYS[4]: its
# leaving set (`app.admission.waiting`), KEYS[5]: its held hash, KEYS[6]: its records
# counter (`app.admission.ledger`), KEYS[7]: its senders' counts, KEYS[8]: theirs on the low
# list, KEYS[9]: the low list (`app.admission.senders`). ARGV[1]: the bound in records,
# ARGV[2]: an epoch to use if none exists, ARGV[3]: "1" to push nothing while the behind
# key exists, ARGV[4]: a token to record in the leaving set if records are left out ("" for
# none), ARGV[5]: its expiry in ms, ARGV[6]: a sender's fair share in records, ARGV[7..]:
# for each message in turn its delivery tag, its record count, its sender and itself,
# pushed in order while its records fit under the bound.
# Returns {messages pushed, records after, epoch, 1 if nothing was pushed for the behind key}.
_PUSH_BOUNDED = """
local epoch = redis.call('GET', KEYS[2])
if not epoch then
    epoch = ARGV[2]
    redis.call('SET', KEYS[2], epoch)
end
local depth = tonumber(redis.call('GET', KEYS[6]) or '0')
local behind = 0
local room = tonumber(ARGV[1]) - depth
if ARGV[3] == '1' and redis.call('EXISTS', KEYS[3]) == 1 then
    behind = 1
    room = 0
end
local share = tonumber(ARGV[6])
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local pushed, records = 0, 0
for i = 7, #ARGV, 4 do
    local n = tonumber(ARGV[i + 1])
    if records + n > room then break end
    local sender = ARGV[i + 2]
    local had = redis.call('HINCRBY', KEYS[7], sender, n)
    local low = 0
    if had > share or redis.call('HEXISTS', KEYS[8], sender) == 1 then
        low = 1
        redis.call('HINCRBY', KEYS[8], sender, n)
        redis.call('LPUSH', KEYS[9], ARGV[i + 3])
    else
        redis.call('LPUSH', KEYS[1], ARGV[i + 3])
    end
    redis.call('HSET', KEYS[5], ARGV[i], n .. ',' .. now_ms .. ',' .. low .. ',' .. sender)
    pushed = pushed + 1
    records = records + n
end
if records > 0 then redis.call('INCRBY', KEYS[6], records) end
if ARGV[4] ~= '' and pushed < (#ARGV - 6) / 4 then
    redis.call('ZADD', KEYS[4], now_ms + tonumber(ARGV[5]), ARGV[4])
    if behind == 0 then
        -- The bound left them out: newer records must wait behind them.
        redis.call('SET', KEYS[3], ARGV[4])
    end
end
return {pushed, depth + records, epoch, behind}
"""

_CURRENT_EPOCH = """
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
"""


@dataclass(frozen=True, kw_only=True)
class PushResult:
    """How many of the records went onto the queue (the first `pushed`), its depth in
    messages, the epoch they were pushed in, and whether none was pushed because older
    records of the line wait in the journal (`behind`). `leaving`: the token to give
    `Waiting.left_kept` once the records left out are kept in the journal."""

    pushed: int
    depth: int
    epoch: str
    behind: bool = False
    leaving: str | None = None


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
        business_nos: Sequence[str] | None = None,
        traceparents: Sequence[str | None] | None = None,
    ) -> PushResult:
        """Push the messages of `record_ids` onto `queue`, `batch_size` records to a
        message, in order while their records fit: the queue never holds more than
        `max_length` records (`app.admission.ledger`). `pushed` counts records.

        `behind`: new records, which push nothing while older ones of the line wait in the
        journal. `keeps_left`: the caller keeps what is not pushed in the journal, to be
        pushed later (`deferred`, `failed`): newer records then wait behind it, and the
        caller gives `leaving` to `self.waiting.left_kept` once its journal says so.
        `senders`: each record's sender (`Record.sender`; all
        `UNNAMED` when None): a message carries one sender's records, and goes on the queue's
        low list once its sender has more than `fair_share` records on the line.
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
            pushed, depth, epoch, waiting = self._script(
                keys=[
                    queue,
                    EPOCH_KEY,
                    BEHIND_KEY.format(queue=queue),
                    LEAVING_KEY.format(queue=queue),
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
                    *messages,
                ],
            )
        except redis.RedisError as exc:
            spans.finish(record_ids, pushed=0, error=f"{type(exc).__name__}: {exc}")
            raise BrokerUnavailable(f"push to {queue!r} failed: {exc}") from exc
        records = sum(1 if isinstance(arg, str) else len(arg) for arg in args[: int(pushed)])
        spans.finish(record_ids, pushed=records)
        return PushResult(
            pushed=records,
            depth=int(depth),
            epoch=as_text(epoch),
            behind=bool(waiting),
            leaving=token if token and int(pushed) < len(args) else None,
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
