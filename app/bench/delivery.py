"""The delivery scenario: order records delivered by the HTTP sink to a downstream that
answers 200 after a fixed delay (`app.bench.downstream`, a process of its own), beside plain
Celery tasks posting the same bodies to the same downstream. At each of `DELAYS_MS`:

- ours end to end: records posted through the intake (signed) with the line's worker
  running, timed from the first post until all are `done`;
- ours drain: as many records journaled and queued through the intake with no worker
  running, then one worker started, timed from its ready line until all are `done`: the
  delivery path's own capacity (the intake's is measured by the intake scenario);
- plain Celery: as many tasks queued, then a prefork worker of the line's `concurrency`
  processes (acks late, prefetch 1, as ours) started, timed from its ready line until its
  queue is drained.

Our worker runs with the line's defaults (concurrency, batch size): the bench tunes
nothing. Each run has a downstream of its own, which counts its requests, their distinct
`Idempotency-Key`s and the most it held at once."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import redis

from app.bench.celery_drain import start_reference_worker, wait_drained, wait_ready
from app.bench.downstream import STATS_PATH
from app.bench.end_to_end import post_until_done, signed_orders
from app.bench.load import Request, run_load
from app.bench.reference import DELIVER_QUEUE, DELIVER_TASK, DOWNSTREAM_URL_ENV, make_celery
from app.bench.stack import BenchStack, order_body
from app.ids import new_id
from app.journal.models import RecordStatus
from app.lines import Line, LineRegistry
from app.local.processes import Child, app_cli, free_port, listening, wait_until

# The downstream's delays: a fast service, and a slow one.
DELAYS_MS = (20, 100)
# The downstream's own check, alone: this many connections of the bench's load generator,
# each posting again once answered (at 20 ms, at most 6,400 requests/s), for `CHECK_S`
# (`CHECK_QUICK_S` in a quick run).
CHECK_CONNECTIONS = 128
CHECK_S, CHECK_QUICK_S = 3.0, 1.0
# The longest a run may wait beyond every record delivered one after another.
SLACK_S = 120.0
# Plain Celery at our worker's process count (one): one delivery in flight, so fewer tasks
# (`SAME_QUICK` in a quick run) keep its run short; its rate is what is compared.
SAME_PROCESSES = 1
SAME, SAME_QUICK = 400, 100


@contextmanager
def downstream(bench: BenchStack, name: str, *, delay_ms: int) -> Iterator[str]:
    """A downstream answering after `delay_ms`, in a process of its own; yields its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "app.bench.downstream", str(port), str(delay_ms)]
    child = bench.start_child(name, argv)
    try:
        wait_until(lambda: listening(port), timeout_s=30, what=f"{name} to listen")
        yield f"http://127.0.0.1:{port}"
    finally:
        bench.stop_child(child)


def seen(url: str) -> dict[str, int]:
    """What the downstream at `url` counted: requests, distinct_keys, max_in_flight."""
    counts: dict[str, int] = httpx.get(url + STATS_PATH, timeout=10).json()
    return counts


def delivery(bench: BenchStack) -> None:
    # A quick run (the test suite's) takes the first delay only.
    delays = DELAYS_MS[:1] if bench.quick else DELAYS_MS
    bench.results["delivery"] = {
        "delays_ms": list(delays),
        "runs": [_at_delay(bench, delay_ms) for delay_ms in delays],
    }


def _at_delay(bench: BenchStack, delay_ms: int) -> dict[str, Any]:
    count = bench.sizes.delivery
    line = _line(bench)
    timeout_s = SLACK_S + count * delay_ms / 1000
    alone = _downstream_alone(bench, delay_ms)
    e2e_s, e2e, e2e_done = _ours_end_to_end(bench, delay_ms, count=count, timeout_s=timeout_s)
    drain_s, drain, drain_done = _ours_drain(bench, delay_ms, count=count, timeout_s=timeout_s)
    plain_s, plain = _plain(bench, delay_ms, count=count, processes=line.settings.concurrency)
    same_count = min(count, SAME_QUICK if bench.quick else SAME)
    same_s, same = _plain(bench, delay_ms, count=same_count, processes=SAME_PROCESSES)
    ours_per_s, plain_per_s = count / drain_s, count / plain_s
    same_per_s = same_count / same_s
    return {
        "delay_ms": delay_ms,
        "records": count,
        "concurrency": line.settings.concurrency,
        # Ours: `pipeline worker LINE` as it starts by default on an HTTP-sink line, one
        # process keeping `deliveries_in_flight` deliveries in flight on its event loop.
        "ours_pool": f"1 process, {line.settings.deliveries_in_flight} deliveries in flight",
        "batch_size": line.batch_size,
        "downstream_alone_per_s": alone,
        "downstream_alone_connections": CHECK_CONNECTIONS,
        "ours_e2e_done": e2e_done,
        "ours_drain_done": drain_done,
        "ours_e2e_records_per_s": round(count / e2e_s, 1),
        "ours_drain_records_per_s": round(ours_per_s, 1),
        "plain_records_per_s": round(plain_per_s, 1),
        "ratio": round(ours_per_s / plain_per_s, 2),
        # Plain Celery with as many processes as ours.
        "plain_same_processes": SAME_PROCESSES,
        "plain_same_records": same_count,
        "plain_same_records_per_s": round(same_per_s, 1),
        "plain_same_max_in_flight": same["max_in_flight"],
        "ratio_same": round(ours_per_s / same_per_s, 2),
        "ours_max_in_flight": drain["max_in_flight"],
        "ours_e2e_max_in_flight": e2e["max_in_flight"],
        "plain_max_in_flight": plain["max_in_flight"],
        "downstream": {"ours_e2e": e2e, "ours_drain": drain, "plain": plain, "plain_same": same},
        "each_once": all(c["requests"] == c["distinct_keys"] == count for c in (e2e, drain, plain))
        and same["requests"] == same["distinct_keys"] == same_count,
    }


def _line_env(url: str) -> dict[str, str]:
    """The order line as an HTTP-sink line posting to the downstream at `url`."""
    return {"PIPELINE_LINES__ORDER__DOWNSTREAM_URL": f"{url}/deliveries"}


def _line(bench: BenchStack) -> Line:
    """The order line as our worker sees it: its defaults, with a downstream."""
    settings = bench.child_settings(**_line_env("http://127.0.0.1:1"))
    return LineRegistry.from_settings(settings).get("order")


def _downstream_alone(bench: BenchStack, delay_ms: int) -> float:
    """Requests/s a downstream answers, loaded by `CHECK_CONNECTIONS` connections."""
    seconds = CHECK_QUICK_S if bench.quick else CHECK_S
    bench.progress(f"delivery: the downstream alone, {delay_ms} ms, {seconds:.0f} s")

    def make(n: int) -> Request:
        headers = {"content-type": "application/json", "idempotency-key": str(n)}
        return ("POST", "/deliveries", headers, b"{}")

    with downstream(bench, f"downstream-{delay_ms}ms-alone", delay_ms=delay_ms) as url:
        result = run_load(url, make, concurrency=CHECK_CONNECTIONS, duration_s=seconds)
    return round(result.rate, 1)


def _our_worker(bench: BenchStack, name: str, env: dict[str, str]) -> tuple[Child, float]:
    """The order line's worker with the line's own settings; returns it and when it was
    ready."""
    child = bench.start_child(name, app_cli("worker", "order"), **env)
    try:
        return child, wait_ready(bench, name)
    except BaseException:
        bench.stop_child(child)
        raise


def _ours_end_to_end(
    bench: BenchStack, delay_ms: int, *, count: int, timeout_s: float
) -> tuple[float, dict[str, int], int]:
    """Seconds from the first post of `count` records to all done; the downstream's
    counts, and the records done."""
    bench.reset()
    bench.progress(f"delivery: {count} records through intake and a worker, {delay_ms} ms")
    requests = signed_orders(count)
    with downstream(bench, f"downstream-{delay_ms}ms-e2e", delay_ms=delay_ms) as url:
        env = _line_env(url)
        worker, _ready = _our_worker(bench, f"worker-delivery-{delay_ms}ms-e2e", env)
        try:
            target = "app.intake.asgi:app_from_env"
            with bench.server(f"intake-delivery-{delay_ms}ms-e2e", target, **env) as (intake, _):
                _posted_s, done_s = post_until_done(bench, intake, requests, timeout_s=timeout_s)
        finally:
            bench.stop_child(worker)
        return done_s, seen(url), _check_journal(bench, count)


def _ours_drain(
    bench: BenchStack, delay_ms: int, *, count: int, timeout_s: float
) -> tuple[float, dict[str, Any], int]:
    """Seconds from a worker's ready line to `count` records done, journaled and queued
    before it started; the downstream's counts (and the CPU each process spent per record
    meanwhile), and the records done."""
    bench.reset()
    bench.progress(f"delivery: {count} records queued, then drained by a worker, {delay_ms} ms")
    requests = signed_orders(count)
    with downstream(bench, f"downstream-{delay_ms}ms-drain", delay_ms=delay_ms) as url:
        env = _line_env(url)
        target = "app.intake.asgi:app_from_env"
        with bench.server(f"intake-delivery-{delay_ms}ms-drain", target, **env) as (intake, _):
            posted = run_load(
                intake,
                requests.__getitem__,
                concurrency=bench.sizes.concurrency,
                duration_s=timeout_s,
                total=count,
            )
        accepted = sum(n for status, n in posted.statuses.items() if 200 <= status < 300)
        queued = bench.journal_count(line="order", status=RecordStatus.ENQUEUED)
        if accepted != count or queued != count:
            raise RuntimeError(f"{accepted} of {count} records accepted, {queued} enqueued")
        worker, ready = _our_worker(bench, f"worker-delivery-{delay_ms}ms-drain", env)
        try:
            with bench.cpu_of(worker=worker.process.pid if worker.process else None) as cpu:
                wait_until(
                    lambda: bench.journal_count(line="order", status=RecordStatus.DONE) >= count,
                    timeout_s=timeout_s,
                    what=f"{count} records to be done",
                )
            done_s = time.monotonic() - ready
        finally:
            bench.stop_child(worker)
        return (
            done_s,
            {**seen(url), "cpu_ms_per_record": cpu.ms_per(count)},
            _check_journal(bench, count),
        )


def _check_journal(bench: BenchStack, count: int) -> int:
    """The order records done; raises unless the journal holds `count`, every one done."""
    total = bench.journal_count(line="order")
    done = bench.journal_count(line="order", status=RecordStatus.DONE)
    if total != count or done != count:
        raise RuntimeError(f"{done} of {total} order records done; {count} were posted")
    return done


def _plain(
    bench: BenchStack, delay_ms: int, *, count: int, processes: int
) -> tuple[float, dict[str, Any]]:
    """Seconds from a plain Celery worker's ready line to `count` delivery tasks, queued
    before it started, drained; the downstream's counts (and the CPU each process spent
    per record meanwhile)."""
    bench.reset()
    bench.progress(f"delivery: plain Celery, {count} tasks drained by a worker, {delay_ms} ms")
    _queue_plain(bench, count)
    with downstream(bench, f"downstream-{delay_ms}ms-plain", delay_ms=delay_ms) as url:
        worker, ready = start_reference_worker(
            bench,
            f"celery-deliver-{delay_ms}ms",
            queue=DELIVER_QUEUE,
            concurrency=processes,
            **{DOWNSTREAM_URL_ENV: f"{url}/deliveries"},
        )
        try:
            pid = worker.process.pid if worker.process else None
            with redis.Redis.from_url(bench.redis_url) as client, bench.cpu_of(worker=pid) as cpu:
                wait_drained(client, DELIVER_QUEUE, timeout_s=SLACK_S + count * delay_ms / 1000)
            done_s = time.monotonic() - ready
        finally:
            bench.stop_child(worker)
        return done_s, {**seen(url), "cpu_ms_per_record": cpu.ms_per(count)}


def _queue_plain(bench: BenchStack, count: int) -> None:
    """`count` plain delivery tasks, each with the body our HTTP sink posts for a record."""
    tag = uuid.uuid4().hex[:8]
    app = make_celery(bench.redis_url)
    try:
        with app.producer_or_acquire() as producer:
            for n in range(count):
                payload = order_body(n, tag)
                body = {
                    "id": new_id(datetime.now(UTC)),
                    "line": "order",
                    "business_no": payload["business_no"],
                    "payload": payload,
                }
                app.send_task(DELIVER_TASK, args=(body,), queue=DELIVER_QUEUE, producer=producer)
    finally:
        app.close()
    with redis.Redis.from_url(bench.redis_url) as client:
        queued = client.llen(DELIVER_QUEUE)
    if queued != count:
        raise RuntimeError(f"{queued} of {count} plain tasks queued")
