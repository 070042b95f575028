"""Scenarios of the journal beside the intake's load: the intake's latency while pollers
read the status routes of a large journal, and while retention purges one; each beside
the intake alone, in the same run and on the same journal."""

from __future__ import annotations

import functools
import json
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, insert

from app.bench.load import LoadResult, Request, merged, run_load
from app.bench.procs import log_path, wait_until
from app.bench.stack import BenchStack, load_figures, order_body, signed_request
from app.journal.models import RecordStatus, Source, records

# Rows written per statement while a journal is filled.
FILL_BATCH = 10_000
# Pollers of /v1/lines and /metrics, each asking again as soon as it is answered.
POLLERS = 8
# `done` records older than this are retention's (its default setting).
RETENTION_DAYS = 30
# The intake's load runs in slices of this while a purge runs, until the purge ends.
SLICE_S = 1.0
# The longest a purge may take here.
PURGE_TIMEOUT_S = 900.0


def fill_journal(
    engine: Engine,
    rows: int,
    *,
    status: RecordStatus,
    at: datetime,
    finished_at: datetime | None = None,
    next_attempt_at: datetime | None = None,
) -> None:
    """Write `rows` records of the order line in `status`, created and changed `at`."""
    with engine.begin() as conn:
        for start in range(0, rows, FILL_BATCH):
            conn.execute(
                insert(records),
                [
                    {
                        "id": f"{n:026d}",
                        "line": "order",
                        "business_no": f"R-{n}",
                        "source": Source.INTAKE.value,
                        "dedup_key": f"bench:{n}",
                        "body_sha256": "0" * 64,
                        "payload": {"business_no": f"R-{n}", "amount": 42},
                        "status": status.value,
                        "attempts": 1,
                        "created_at": at,
                        "updated_at": at,
                        "finished_at": finished_at,
                        "next_attempt_at": next_attempt_at,
                        "task_id": f"{n:026d}",
                    }
                    for n in range(start, min(rows, start + FILL_BATCH))
                ],
            )


def _requests(offset: int) -> tuple[functools.partial[Request], functools.partial[Request]]:
    """A warm-up's requests and the measured ones, each with its own nonce."""
    tag = uuid.uuid4().hex[:8]

    def make(n: int) -> Request:
        return signed_request("order", tag, order_body(n, tag))

    return functools.partial(_shifted, make, 0), functools.partial(_shifted, make, offset)


def _shifted(make: Any, offset: int, n: int) -> Request:
    result: Request = make(n + offset)
    return result


def polled(bench: BenchStack) -> None:
    """Intake latency with `POLLERS` pollers of the status routes on a large journal, beside
    the intake alone on the same journal."""
    sizes, rows = bench.sizes, bench.sizes.journal_rows
    bench.reset()
    bench.progress(f"polled: filling the journal with {rows:,} done records")
    engine = bench.engine()
    try:
        at = datetime.now(UTC) - timedelta(hours=1)
        fill_journal(engine, rows, status=RecordStatus.DONE, at=at, finished_at=at)
    finally:
        engine.dispose()
    warmup, measured = _requests(10_000_000)
    with bench.server("intake-polled", "app.intake.asgi:app_from_env") as (url, _child):
        run_load(url, warmup, concurrency=sizes.concurrency, duration_s=sizes.warmup_s)
        bench.progress(f"polled: intake alone, {sizes.intake_s:.0f} s")
        alone = run_load(url, measured, concurrency=sizes.concurrency, duration_s=sizes.intake_s)
        bench.progress(
            f"polled: intake beside {POLLERS} pollers of /v1/lines and /metrics, "
            f"{sizes.intake_s:.0f} s"
        )
        argv = [sys.executable, "-m", "app.bench.pollers", url, str(POLLERS)]
        pollers = bench.start_child("pollers", [*argv, str(sizes.intake_s + 1)])
        try:
            time.sleep(0.5)  # the pollers' first answers: their clients and the view's cache
            beside = run_load(
                url,
                functools.partial(_shifted, measured, 20_000_000),
                concurrency=sizes.concurrency,
                duration_s=sizes.intake_s,
            )
            process = pollers.process
            assert process is not None
            wait_until(lambda: process.poll() is not None, timeout_s=180, what="the pollers")
        finally:
            bench.stop_child(pollers)
    polls = json.loads(log_path(bench.workdir, "pollers").read_text().strip().splitlines()[-1])
    bench.results["polled"] = {
        "rows": rows,
        "pollers": POLLERS,
        "polls": polls["polls"],
        "polls_not_ok": polls["not_ok"],
        "polls_per_s": round(polls["polls"] / polls["seconds"], 1),
        "alone": load_figures(alone),
        "polled": load_figures(beside),
    }


def retention(bench: BenchStack) -> None:
    """One retention run over a journal of expired records, in a process of its own, the
    intake under load meanwhile; beside the intake alone on the same journal before it."""
    sizes, rows = bench.sizes, bench.sizes.journal_rows
    bench.reset()
    bench.progress(f"retention: filling the journal with {rows:,} expired done records")
    engine = bench.engine()
    try:
        expired = datetime.now(UTC) - timedelta(days=RETENTION_DAYS + 10)
        fill_journal(engine, rows, status=RecordStatus.DONE, at=expired, finished_at=expired)
    finally:
        engine.dispose()
    warmup, measured = _requests(10_000_000)
    with bench.server("intake-retention", "app.intake.asgi:app_from_env") as (url, _child):
        run_load(url, warmup, concurrency=sizes.concurrency, duration_s=sizes.warmup_s)
        bench.progress(f"retention: intake alone, {sizes.intake_s:.0f} s")
        alone = run_load(url, measured, concurrency=sizes.concurrency, duration_s=sizes.intake_s)
        bench.progress(f"retention: purging {rows:,} records under the intake's load")
        purge = bench.start_child(
            "purge",
            [sys.executable, "-m", "app.bench.purge"],
            PIPELINE_RETENTION_DAYS=str(RETENTION_DAYS),
        )
        process = purge.process
        assert process is not None
        slices: list[LoadResult] = []
        offset = 20_000_000
        try:
            deadline = time.monotonic() + PURGE_TIMEOUT_S
            while process.poll() is None and time.monotonic() < deadline:
                slices.append(
                    run_load(
                        url,
                        functools.partial(_shifted, measured, offset),
                        concurrency=sizes.concurrency,
                        duration_s=SLICE_S,
                    )
                )
                offset += 1_000_000
            wait_until(lambda: process.poll() is not None, timeout_s=60, what="the purge")
        finally:
            bench.stop_child(purge)
    if process.returncode != 0:
        raise RuntimeError(f"the purge failed: see {log_path(bench.workdir, 'purge')}")
    done = json.loads(log_path(bench.workdir, "purge").read_text().strip().splitlines()[-1])
    bench.results["retention"] = {
        "rows": rows,
        "deleted": done["deleted"],
        "seconds": done["seconds"],
        "rows_per_s": round(done["deleted"] / done["seconds"], 1) if done["seconds"] else 0.0,
        "alone": load_figures(alone),
        "during": load_figures(merged(slices)),
    }
