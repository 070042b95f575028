"""Capacity: the intake's CPU time per signed, journaled, pushed request, measured.

One intake process (uvicorn, as `pipeline bench` serves it) takes `requests` signed
requests from the bench's load generator; its CPU time before and after gives the CPU
seconds a request costs, which is what sizes the intake's hosts (its rate on a shared
machine depends on what else runs there)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.bench.load import run_load
from app.bench.procs import cpu_s
from app.bench.stack import BenchStack, signed_request
from tests.capacity.journal import order_payload

# Connections of the load generator, as `pipeline bench` loads the intake.
CONCURRENCY = 16


def measure_intake(
    *,
    redis_url: str,
    database_url: str,
    workdir: Path,
    requests: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Post `requests` signed order requests (after a tenth as many to warm up); the
    intake's rate and CPU milliseconds per request."""
    stack = BenchStack(
        quick=True,
        workdir=workdir,
        redis_url=redis_url,
        database_url=database_url,
        progress=progress,
    )
    tag = uuid.uuid4().hex[:8]
    warmup = max(1, requests // 10)
    made = [signed_request("order", tag, order_payload(n)) for n in range(warmup + requests)]
    try:
        stack.start()
        with stack.server("intake-capacity", "app.intake.asgi:app_from_env") as (url, child):
            assert child.process is not None
            run_load(url, made.__getitem__, concurrency=CONCURRENCY, duration_s=600, total=warmup)
            progress(f"intake: {requests} signed requests, {CONCURRENCY} connections")
            before = cpu_s(child.process.pid)
            result = run_load(
                url,
                lambda n: made[warmup + n],
                concurrency=CONCURRENCY,
                duration_s=600,
                total=requests,
            )
            cpu = cpu_s(child.process.pid) - before
    finally:
        stack.close()
    ok = sum(n for status, n in result.statuses.items() if 200 <= status < 300)
    return {
        "requests": result.requests,
        "non_2xx": result.requests - ok,
        "requests_per_s": round(result.rate, 1),
        "p99_ms": round(result.percentile(0.99) * 1000, 1),
        "cpu_ms_per_request": round(cpu * 1000 / max(1, result.requests), 2),
    }
