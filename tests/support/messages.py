"""Reading the task messages a line's queue holds."""

from __future__ import annotations

import base64
import json

import redis


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
