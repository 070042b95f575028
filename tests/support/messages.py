"""Reading the task messages a line's queue holds."""

from __future__ import annotations

import base64
import json

import redis

from app.admission.ledger import RELEASE, count_keys
from app.admission.senders import queue_lists


def message_args(raw: bytes) -> object:
    """The task argument of a queued message: a record id, or a list of them."""
    args, _kwargs, _embed = json.loads(base64.b64decode(json.loads(raw)["body"]))
    return args[0]


def queued_ids(client: redis.Redis, queue: str) -> list[str]:
    """The record ids `queue`'s messages carry, in the order its workers take them: its
    list, oldest message first, then its low list (senders past their fair share), the
    same way (a message carries one, or a batch: see a line's `batch_size`)."""
    ids: list[str] = []
    for listed in queue_lists(queue):
        for raw in reversed(client.lrange(listed, 0, -1)):
            args = message_args(raw)
            ids.extend([args] if isinstance(args, str) else args)  # type: ignore[arg-type]
    return ids


def take_and_ack(client: redis.Redis, queue: str) -> bytes | None:
    """What a worker does with `queue`'s next message, at once: take it and ack it (its
    records leave the line's counts). The message, or None when the queue is empty."""
    for listed in queue_lists(queue):
        raw = client.rpop(listed)
        if raw is not None:
            tag = json.loads(raw)["properties"]["delivery_tag"]
            keys = count_keys(queue)
            client.eval(RELEASE, len(keys), *keys, tag)
            return raw
    return None


def empty_queue(client: redis.Redis, queue: str) -> None:
    """Drop every message of `queue`, and its counts with them (as a purge would)."""
    client.delete(*queue_lists(queue), *count_keys(queue))
