"""The end-to-end scenario: order records posted through the intake (signed) until a worker
has them all `done`, with the line's default batch size and with one record to a message;
beside a bare Celery worker draining as many no-op tasks."""

from __future__ import annotations

import time
import uuid

from app.bench.celery_drain import noop_drain
from app.bench.load import Request, run_load
from app.bench.procs import RssSampler
from app.bench.stack import POOL, BenchStack, order_body, signed_request
from app.journal.models import RecordStatus
from app.lines import TABLE_SINK_BATCH
from app.local.processes import wait_until

# The scenario runs again with the order line carrying one record to a queue message (its
# `batch_size`), beside the default (`TABLE_SINK_BATCH` on the table sink).
E2E_SINGLE = 1


def end_to_end(bench: BenchStack) -> None:
    count = bench.sizes.end_to_end
    default, default_cpu = _through_intake(bench, count, None)
    single, single_cpu = _through_intake(bench, count, E2E_SINGLE)
    bench.progress(f"end to end: bare Celery no-op drain of {count} tasks")
    bench.reset()
    drain_s, noop_cpu = noop_drain(bench, count)
    bench.results["end_to_end"] = {
        "records": count,
        "ours_records_per_s": round(count / default[1], 1),
        "ours_intake_s": round(default[0], 2),
        "ours_cpu_ms_per_record": default_cpu,
        "batch_size": TABLE_SINK_BATCH,
        "ours_single_records_per_s": round(count / single[1], 1),
        "ours_single_intake_s": round(single[0], 2),
        "ours_single_cpu_ms_per_record": single_cpu,
        "celery_noop_per_s": round(count / drain_s, 1),
        "celery_noop_cpu_ms_per_record": noop_cpu,
        "pool": f"{POOL[0]} {POOL[1]}",
    }


def signed_orders(count: int) -> list[Request]:
    """`count` signed order requests, each its own record (a tag of their own)."""
    tag = uuid.uuid4().hex[:8]
    return [signed_request("order", tag, order_body(n, tag)) for n in range(count)]


def post_until_done(
    bench: BenchStack, url: str, requests: list[Request], *, timeout_s: float
) -> tuple[float, float]:
    """Post `requests` (order records) to the intake at `url`, then wait until the journal
    has as many order records `done`. Returns (seconds to post them, seconds to done),
    both from the first post."""
    count = len(requests)
    started = time.monotonic()
    run_load(
        url, requests.__getitem__, concurrency=bench.sizes.concurrency, duration_s=3600, total=count
    )
    posted_s = time.monotonic() - started
    wait_until(
        lambda: bench.journal_count(line="order", status=RecordStatus.DONE) >= count,
        timeout_s=timeout_s,
        what=f"{count} records to be done",
    )
    return posted_s, time.monotonic() - started


def _through_intake(
    bench: BenchStack, count: int, batch: int | None
) -> tuple[tuple[float, float], dict[str, float]]:
    """Post `count` order records and wait until all are done, the order line packing up to
    `batch` records to a message (None: its default). Returns (seconds to post them,
    seconds to done), and the CPU each process on the path spent per record."""
    bench.reset()
    bench.progress(
        f"end to end: {count} records through intake and an order worker, "
        + ("default settings" if batch is None else f"{batch} to a message")
    )
    env = {} if batch is None else {"PIPELINE_LINES__ORDER__BATCH_SIZE": str(batch)}
    worker = bench.worker("order", **env)
    # Signed before the clock starts: the client's work is not the pipeline's.
    requests = signed_orders(count)
    with bench.server("intake-e2e", "app.intake.asgi:app_from_env", **env) as (url, child):
        assert worker.process is not None
        assert child.process is not None
        cpu = bench.cpu_of(intake=child.process.pid, worker=worker.process.pid)
        with RssSampler(worker.process.pid, include_children=True) as rss, cpu:
            seconds = post_until_done(bench, url, requests, timeout_s=max(120, count / 20))
    bench.stop_child(worker)
    if batch is None:
        bench.results.setdefault("memory", {})["worker"] = rss.summary()
    return seconds, cpu.ms_per(count)
