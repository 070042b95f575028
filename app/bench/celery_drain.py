"""Bare Celery workers of the references (`app.bench.reference`), and how the bench times
a drain: a worker started on the bench's Redis, waited for until its log says it is ready,
and its queue emptied."""

from __future__ import annotations

import sys
import time

import redis

from app.admission.push import build_message
from app.bench.reference import NOOP_QUEUE, NOOP_TASK
from app.bench.stack import POOL, BenchStack
from app.local.processes import Child, log_file, wait_until

# What Celery's worker logs once it consumes (`celery@host ready.`), ours as the references'.
READY_MARK = " ready."
# The longest a worker may take to start.
START_TIMEOUT_S = 60.0
# Messages pushed per LPUSH.
PUSH_CHUNK = 1000


def wait_ready(bench: BenchStack, name: str) -> float:
    """Wait for the ready line in the log of the child `name` (a name used once per run:
    its log is appended to); returns `time.monotonic()` when it was seen."""
    log = log_file(bench.workdir, name)
    wait_until(
        lambda: log.exists() and READY_MARK in log.read_text(errors="replace"),
        timeout_s=START_TIMEOUT_S,
        what=f"{name} to be ready",
    )
    return time.monotonic()


def start_reference_worker(
    bench: BenchStack,
    name: str,
    *,
    queue: str,
    concurrency: int,
    pool: str = "prefork",
    **env: str,
) -> tuple[Child, float]:
    """A worker of the references' Celery app consuming `queue` in `pool` with
    `concurrency` (`env`: more variables for it); returns it and when it was ready."""
    argv = [
        *(sys.executable, "-m", "celery", "-A", "app.bench.reference:celery", "worker"),
        *("-Q", queue, "--pool", pool, "--concurrency", str(concurrency)),
        *("--without-mingle", "--without-gossip", "--loglevel", "INFO"),
    ]
    child = bench.start_child(name, argv, **env)
    try:
        return child, wait_ready(bench, name)
    except BaseException:
        bench.stop_child(child)
        raise


def wait_drained(client: redis.Redis, queue: str, *, timeout_s: float) -> None:
    """Until `queue` is empty and no message is unacked (acks late: each task returned)."""
    wait_until(
        lambda: client.llen(queue) == 0 and client.hlen("unacked") == 0,
        timeout_s=timeout_s,
        what=f"the {queue} queue to drain",
    )


def noop_drain(bench: BenchStack, count: int) -> tuple[float, dict[str, float]]:
    """Seconds a ready no-op worker (`POOL`) takes to drain `count` messages pushed at
    once, and the CPU it (and Redis) spent per message meanwhile."""
    pool, size = POOL
    child, _ready = start_reference_worker(
        bench, "celery-noop", queue=NOOP_QUEUE, concurrency=size, pool=pool
    )
    try:
        with redis.Redis.from_url(bench.redis_url) as client:
            messages = [
                build_message(f"noop-{n}", queue=NOOP_QUEUE, origin="bench", task=NOOP_TASK)
                for n in range(count)
            ]
            cpu = bench.cpu_of(worker=child.process.pid if child.process else None)
            started = time.monotonic()
            with cpu:
                with client.pipeline(transaction=False) as pipe:
                    for chunk in range(0, count, PUSH_CHUNK):
                        pipe.lpush(NOOP_QUEUE, *messages[chunk : chunk + PUSH_CHUNK])
                    pipe.execute()
                wait_drained(client, NOOP_QUEUE, timeout_s=max(120, count / 20))
            return time.monotonic() - started, cpu.ms_per(count)
    finally:
        bench.stop_child(child)
