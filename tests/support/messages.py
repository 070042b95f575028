"""Reading the task messages a line's queue holds."""

from __future__ import annotations

import base64
import json

import redis

from app.admission.ledger import RELEASE, held_key, records_key


def message_args(raw: bytes) -> object:
    """The task argument of a queued message: a record id, or a list of them."""
    args, _kwargs, _embed = json.loads(base64.b64decode(json.loads(raw)["body"]))
    return args[0]


def queued_ids(client: redis.Redis, queue: str) -> list[str]:
    """The record ids `queue`'s messages carry, oldest message first (a message carries
    one, or a batch: see a line's `batch_size`)."""
    ids: list[str] = []
    for raw in reversed(client.lrange(queue, 0, -1)):
        args = message_args(raw)
        ids.extend([args] if isinstance(args, str) else args)  # type: ignore[arg-type]
    return ids


def take_and_ack(client: redis.Redis, queue: str) -> bytes | None:
    """What a worker does with `queue`'s oldest message, at once: take it and ack it (its
    records leave the line's count). The message, or None when the queue is empty."""
    raw = client.rpop(queue)
    if raw is None:
        return None
    tag = json.loads(raw)["properties"]["delivery_tag"]
    client.eval(RELEASE, 2, held_key(queue), records_key(queue), tag)
    return raw


def empty_queue(client: redis.Redis, queue: str) -> None:
    """Drop every message of `queue`, and its count with them (as a purge would)."""
    client.delete(queue, held_key(queue), records_key(queue))
