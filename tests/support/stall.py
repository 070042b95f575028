"""A fault for a real worker: its consumer stays subscribed to its queues but fetches nothing.

`detach_fetch` is a line handler (run by a `--pool solo` worker, so in the worker's main
process, on the consumer's event loop): for the record whose business number is
`DETACH_BUSINESS_NO` it cancels the worker's queues on the kombu channel behind Celery's
back, so Celery's consumer still says it consumes them while no fetch asks for their
messages."""

from __future__ import annotations

import gc
import os
import time

import redis
from celery.worker.consumer.consumer import Consumer

from app.journal.models import Record

DETACH_BUSINESS_NO = "DETACH"


def detach_fetch(record: Record) -> None:
    if record.business_no != DETACH_BUSINESS_NO:
        return
    # Found without any hook of the pipeline's, so the fault is the same on any version.
    (consumer,) = [o for o in gc.get_objects() if isinstance(o, Consumer)]
    task_consumer = consumer.task_consumer
    for queue in task_consumer.queues:
        # Behind the consumer's back: it keeps the tag, the channel no longer fetches.
        task_consumer.channel.basic_cancel(task_consumer._active_tags[queue.name])


# Longer than the stall threshold the tests set (2 s), so that waiting messages outlast it
# while every slot is held.
HOLD_S = 4.0


def hold(record: Record) -> None:
    """A long task: holds its pool slot for `HOLD_S`."""
    time.sleep(HOLD_S)


# The record `hold_long` holds its slot with; any other record ends at once.
LONG_BUSINESS_NO = "LONG"
# Longer than the soft shutdown the tests give the worker, so that it is still running
# when the worker stops.
LONG_HOLD_S = 30.0


def hold_long(record: Record) -> None:
    """A long task for the record `LONG_BUSINESS_NO`; every other record ends at once."""
    if record.business_no == LONG_BUSINESS_NO:
        time.sleep(LONG_HOLD_S)


# The record for which `block_loop` blocks the worker's event loop.
BLOCK_BUSINESS_NO = "BLOCK"
# A push to this key ends the block; else it lasts longer than the tests wait.
UNBLOCK_KEY = "tests:unblock-loop"
BLOCK_S = 120


def block_loop(record: Record) -> None:
    """A line handler for a `--pool solo` worker: for the record `BLOCK_BUSINESS_NO`, hands
    the consumer's event loop a callback that waits for `UNBLOCK_KEY` (at most `BLOCK_S`),
    so that the loop is stuck once this task has ended and freed the worker's slot (a long
    task would hold it)."""
    if record.business_no != BLOCK_BUSINESS_NO:
        return
    (consumer,) = [o for o in gc.get_objects() if isinstance(o, Consumer)]
    consumer.call_soon(_wait_for_unblock, redis.Redis.from_url(os.environ["PIPELINE_REDIS_URL"]))


def _wait_for_unblock(client: redis.Redis) -> None:
    deadline = time.monotonic() + BLOCK_S
    while not client.exists(UNBLOCK_KEY) and time.monotonic() < deadline:
        time.sleep(0.1)
