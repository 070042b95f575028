"""Capacity: what waiting messages take in Redis, measured.

A Redis server of our own on a free loopback port (the system's `redis-server` where there
is one, else the Valkey `pipeline up` embeds); messages pushed by the product's `Pusher`
exactly as the intake pushes them; `INFO memory` before and after."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from app.admission.ledger import count_keys
from app.admission.push import Pusher
from app.admission.senders import queue_lists, waiting_messages
from app.clock import utcnow
from app.ids import new_id
from app.local.embedded_redis import RedisServer
from app.local.processes import free_port

# Messages pushed per call: the intake's group commit pushes up to this many at once.
PUSH_GROUP = 256
# Long enough for any Redis to start on a loaded machine.
START_TIMEOUT_S = 10.0


@contextmanager
def redis_server(workdir: Path) -> Iterator[tuple[str, str]]:
    """`(url, "<server> <version>")` of a Redis-compatible server started here (the
    system's `redis-server` where there is one, else the embedded Valkey), keeping nothing
    on disk, stopped by its PID when the block ends."""
    server = RedisServer(port=free_port(), workdir=workdir, binary=shutil.which("redis-server"))
    server.start(timeout_s=START_TIMEOUT_S)
    try:
        with server.client() as client:
            info = client.info("server")
        name = "valkey" if "valkey_version" in info else "redis"
        yield server.url, f"{name} {info.get('valkey_version') or info['redis_version']}"
    finally:
        server.stop()


def _used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def measure_waiting(url: str, *, messages: int, batch_size: int = 1) -> dict[str, Any]:
    """Push `messages` messages of `batch_size` records each onto an empty queue, as the
    intake does (no worker takes them); Redis's memory before and after. The queue is
    deleted afterwards."""
    queue = f"capacity-{uuid.uuid4().hex[:8]}"
    with redis.Redis.from_url(url) as client:
        pusher = Pusher(client)
        pusher.epoch()  # the epoch key exists before the first figure
        client.delete(queue)
        before = _used_memory(client)
        records = messages * batch_size
        now = utcnow()
        step = PUSH_GROUP * batch_size
        for start in range(0, records, step):
            ids = [new_id(now) for _ in range(min(step, records - start))]
            numbers = [f"ORD-2026-{start + n:08d}" for n in range(len(ids))]
            pusher.push(
                queue,
                ids,
                max_length=records,
                batch_size=batch_size,
                business_nos=numbers,
            )
        # One sender's records: past its fair share they wait on the queue's low list.
        depth = waiting_messages(client, queue)
        after = _used_memory(client)
        sample = client.lindex(queue, 0)
        message_bytes = len(sample) if isinstance(sample, bytes) else 0
        client.delete(*queue_lists(queue), *count_keys(queue))
    return {
        "messages": depth,
        "records_per_message": batch_size,
        "used_memory_before": before,
        "used_memory_after": after,
        "bytes_per_message": round((after - before) / depth, 1) if depth else 0.0,
        "message_bytes": message_bytes,
    }
