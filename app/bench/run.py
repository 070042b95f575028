"""`pipeline bench`: each scenario beside its reference, measured in one run.

It starts what it needs: its own Redis-compatible server on a free port (unless given
one, whose database it flushes), a journal (a fresh SQLite file unless given a database,
whose pipeline tables it empties), intake servers, workers. Benchmarks report figures;
nothing here passes or fails on speed."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from app.bench import delivery, end_to_end, fair_shares, journal_scenarios
from app.bench.journal_scenarios import fill_journal
from app.bench.load import Request, prepare_wrk, run_load, run_prepared_wrk, run_wrk
from app.bench.procs import RssSampler
from app.bench.stack import (
    BENCH_BOUND,
    BenchStack,
    load_figures,
    order_body,
    plain_request,
    signed_request,
)
from app.clock import as_utc
from app.config.settings import load_settings
from app.journal.engine import make_engine
from app.journal.models import RecordStatus, records
from app.local.processes import Child, wait_until
from app.recovery.replay import ReplayFilter
from app.wiring.runtime import Runtime

# Requests made ahead for wrk, per second of its run: above what any endpoint here serves
# signed and journaled, so each request has its own nonce (the bare endpoint, faster,
# takes them again in turn; it reads no nonce).
WRK_REQUESTS_PER_S = 4_000
# Isolation runs a second flood with the status line's `intake_rate` at this share of the
# status records/s the first flood got journaled.
PACED_SHARE = 0.25
# Isolation's floor: one busy loop per CPU at the lowest CPU priority (nice 19) beside the
# order line, no flood. It touches nothing of the pipeline; what it costs the orders is
# the least any load sharing these CPUs would cost them.
BUSY_LOOP = "import os\nos.nice(19)\nwhile True:\n    pass"


class Bench(BenchStack):
    """The scenarios of one run."""

    def intake(self) -> None:
        sizes = self.sizes
        figures: dict[str, Any] = {}
        targets = {
            "ours": "app.intake.asgi:app_from_env",
            "naive": "app.bench.reference:naive_app",
            "bare": "app.bench.reference:bare_app",
        }
        for name, target in targets.items():
            self.reset()
            self.progress(f"intake: {name} endpoint, {sizes.intake_s:.0f} s")
            tag = uuid.uuid4().hex[:8]

            def make(n: int, name: str = name, tag: str = tag) -> Request:
                body = order_body(n, tag)
                return (
                    signed_request("order", tag, body)
                    if name == "ours"
                    else plain_request("order", body)
                )

            with self.server(f"intake-{name}", target) as (url, child):
                run_load(url, make, concurrency=sizes.concurrency, duration_s=sizes.warmup_s)
                assert child.process is not None
                # Numbers after the warm-up's: each request has its own nonce.
                measured = functools.partial(_offset, make, 10_000_000)
                cpu = self.cpu_of(intake=child.process.pid)
                with RssSampler(child.process.pid) as rss, cpu:
                    if self.wrk:
                        result = run_wrk(
                            url,
                            measured,
                            concurrency=sizes.concurrency,
                            duration_s=sizes.intake_s,
                            count=int(sizes.intake_s * WRK_REQUESTS_PER_S),
                            workdir=self.workdir / f"wrk-{name}",
                        )
                    else:
                        result = run_load(
                            url,
                            measured,
                            concurrency=sizes.concurrency,
                            duration_s=sizes.intake_s,
                        )
                figures[name] = load_figures(result)
                figures[name]["cpu_ms_per_request"] = cpu.ms_per(result.requests)
                if name == "ours":
                    self.results.setdefault("memory", {})["intake"] = rss.summary()
        figures["concurrency"] = sizes.concurrency
        self.results["intake"] = figures

    def end_to_end(self) -> None:
        end_to_end.end_to_end(self)

    def delivery(self) -> None:
        delivery.delivery(self)

    def fair_shares(self) -> None:
        fair_shares.fair_shares(self)

    def replay(self) -> None:
        rows = self.sizes.replay_rows
        self.reset()
        self.progress(f"replay: filling the journal with {rows:,} failed records")
        settings = load_settings(
            redis_url=self.redis_url,
            database_url=self.database_url,
            lines={"order": {"max_queue_length": BENCH_BOUND}},
        )
        rt = Runtime.build(settings)
        try:
            now = datetime.now(UTC) - timedelta(hours=1)
            fill_journal(
                rt.engine,
                rows,
                status=RecordStatus.FAILED,
                at=now,
                next_attempt_at=now + timedelta(days=1),
            )
            self.progress(f"replay: re-enqueueing {rows:,} records")
            started, own_began = time.monotonic(), time.process_time()
            with self.cpu_of() as cpu:
                counts = rt.replayer.replay(
                    ReplayFilter(line="order", statuses=(RecordStatus.FAILED,)),
                    dry_run=False,
                    actor="bench",
                    clock=lambda: datetime.now(UTC),
                )
            seconds = time.monotonic() - started
            own_ms = (time.process_time() - own_began) * 1000 / rows
        finally:
            rt.close()
        self.results["replay"] = {
            "rows": rows,
            "enqueued": counts.enqueued,
            "seconds": round(seconds, 2),
            "records_per_s": round(rows / seconds, 1),
            # The replay runs in the bench's own process.
            "cpu_ms_per_record": {"replay": round(own_ms, 4), **cpu.ms_per(rows)},
        }

    def polled(self) -> None:
        journal_scenarios.polled(self)

    def retention(self) -> None:
        journal_scenarios.retention(self)

    def error_search(self) -> None:
        journal_scenarios.error_search(self)

    def isolation(self) -> None:
        """Order latencies alone, beside busy loops (the floor), while the status line is
        flooded, and while it is flooded with its `intake_rate` at `PACED_SHARE` of what the
        unpaced flood got in."""
        seconds = self.sizes.isolation_s
        self.reset()
        order = self.worker("order")
        status = self.worker("status")
        with self.server("intake-isolation", "app.intake.asgi:app_from_env") as (url, child):
            self._order_latencies(url, 1, tag="warmup")  # connections, caches: not measured
            self.progress(f"isolation: order line alone, {seconds:.0f} s")
            alone = self._order_latencies(url, seconds, tag="alone")
            loops = os.cpu_count() or 1
            self.progress(
                f"isolation: order line beside {loops} busy loops at the lowest CPU priority, "
                f"{seconds:.0f} s"
            )
            busy = self._beside_busy_loops(url, seconds, loops=loops)
            self.progress(
                f"isolation: order line while the status line is flooded, {seconds:.0f} s"
            )
            pids = {
                "intake": child.process.pid if child.process else None,
                "order worker": order.process.pid if order.process else None,
                "status worker": status.process.pid if status.process else None,
            }
            with self.cpu_of(**pids) as flood_cpu:
                flooded, flood_posted = self._flooded(url, seconds, tag="flooded")
        rate = max(1, round(flood_posted / (seconds + 1) * PACED_SHARE))
        paced_intake = self.server(
            "intake-isolation-paced",
            "app.intake.asgi:app_from_env",
            PIPELINE_LINES__STATUS__INTAKE_RATE=str(rate),
        )
        with paced_intake as (url, _child):
            self._order_latencies(url, 1, tag="warmup-paced")
            self.progress(
                f"isolation: order line while the status line is flooded, its intake rate "
                f"{rate}/s, {seconds:.0f} s"
            )
            paced, paced_posted = self._flooded(url, seconds, tag="paced")
        split, split_posted = self._split(seconds, status)
        status_waiting = self.journal_count(line="status") - self.journal_count(
            line="status", status=RecordStatus.DONE
        )
        self.stop_child(order)
        self.results["isolation"] = {
            "alone": alone,
            "busy": busy,
            "busy_loops": loops,
            "flooded": flooded,
            "status_records_posted": flood_posted,
            # Over the flooded phase, per status record journaled.
            "flooded_cpu_ms_per_record": flood_cpu.ms_per(flood_posted),
            "paced": paced,
            "paced_intake_rate": rate,
            "paced_status_records_posted": paced_posted,
            "split": split,
            "split_status_records_posted": split_posted,
            "status_records_unfinished": status_waiting,
        }

    def _split(self, seconds: float, status: Child) -> tuple[dict[str, float], int]:
        """Order latencies while the status line is flooded on an intake of its own
        (`PIPELINE_INTAKE_LINES`), which, with the status worker, runs at the lowest CPU
        priority (`PIPELINE_NICE=19`), as the floor's busy loops do. Stops `status`."""
        self.stop_child(status)
        niced = self.worker("status", PIPELINE_NICE="19")
        target = "app.intake.asgi:app_from_env"
        try:
            with (
                self.server("intake-orders", target, PIPELINE_INTAKE_LINES="order,refund") as (
                    url,
                    _orders,
                ),
                self.server(
                    "intake-status", target, PIPELINE_INTAKE_LINES="status", PIPELINE_NICE="19"
                ) as (flood_url, _status),
            ):
                self._order_latencies(url, 1, tag="warmup-split")
                self.progress(
                    "isolation: order line on its own intake while the status line is "
                    f"flooded on another, at nice 19 with its worker, {seconds:.0f} s"
                )
                return self._flooded(url, seconds, tag="split", flood_url=flood_url)
        finally:
            self.stop_child(niced)

    def _beside_busy_loops(self, url: str, seconds: float, *, loops: int) -> dict[str, float]:
        """Order latencies beside `loops` busy loops at nice 19 (`BUSY_LOOP`)."""
        busy = [
            self.start_child(f"busy-loop-{n}", [sys.executable, "-c", BUSY_LOOP])
            for n in range(loops)
        ]
        try:
            return self._order_latencies(url, seconds, tag="busy")
        finally:
            for child in busy:
                self.stop_child(child)

    def _flooded(
        self, url: str, seconds: float, *, tag: str, flood_url: str | None = None
    ) -> tuple[dict[str, float], int]:
        """Order latencies on `url` while a status flood runs on `flood_url` (else `url`),
        and how many status records the flood got journaled."""
        before = self.journal_count(line="status")
        flood = threading.Thread(
            target=self._status_flood(flood_url or url, seconds + 1), daemon=True
        )
        flood.start()
        time.sleep(1)
        latencies = self._order_latencies(url, seconds, tag=tag)
        flood.join(timeout=seconds + 60)
        return latencies, self.journal_count(line="status") - before

    def _status_flood(self, url: str, seconds: float) -> Callable[[], object]:
        """A flood of status records on `url` for `seconds`, from 8 connections, ready to
        run: from wrk where installed (as the intake scenario's load), its requests made
        now; else from the built-in generator. A load generator's CPU is not the
        pipeline's: wrk takes the least of the two cores the pipeline runs on."""
        tag = uuid.uuid4().hex[:8]

        def make(n: int) -> Request:
            body = {
                "business_no": f"{tag}-{n}",
                "status": "paid",
                "occurred_at": "2026-11-29T10:00:00Z",
            }
            return signed_request("status", tag, body)

        if not self.wrk:
            return functools.partial(run_load, url, make, concurrency=8, duration_s=seconds)
        workdir = self.workdir / "wrk-flood"
        prepare_wrk(url, make, count=int(seconds * WRK_REQUESTS_PER_S), workdir=workdir)
        return functools.partial(
            run_prepared_wrk, url, concurrency=8, duration_s=seconds, workdir=workdir
        )

    def _order_latencies(self, url: str, seconds: float, *, tag: str) -> dict[str, float]:
        """Post an order every 20 ms for `seconds`; intake-to-done latencies of those."""
        ids = []
        with httpx.Client(base_url=url, timeout=30) as client:
            deadline = time.monotonic() + seconds
            n = 0
            while time.monotonic() < deadline:
                method, path, headers, body = signed_request(
                    "order", f"{tag}-{uuid.uuid4().hex[:6]}", order_body(n, tag)
                )
                ids.append(client.request(method, path, headers=headers, content=body).json()["id"])
                n += 1
                time.sleep(0.02)
        engine = make_engine(self.database_url)
        try:
            wait_until(
                lambda: (
                    self.journal_count(line="order", status=RecordStatus.DONE)
                    >= self.journal_count(line="order")
                ),
                timeout_s=120,
                what="the order records to be done",
            )
            with engine.connect() as conn:
                rows = conn.execute(
                    select(records.c.created_at, records.c.finished_at).where(records.c.id.in_(ids))
                ).all()
        finally:
            engine.dispose()
        latencies = sorted(
            (_aware(done) - _aware(created)).total_seconds() for created, done in rows
        )
        return {
            "records": len(latencies),
            "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
            "p99_ms": round(
                latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000, 1
            ),
        }


def _offset(make: Callable[[int], Request], offset: int, n: int) -> Request:
    return make(n + offset)


def _aware(moment: datetime) -> datetime:
    return as_utc(moment)


SCENARIOS = (
    "intake",
    "end_to_end",
    "delivery",
    "fair_shares",
    "replay",
    "polled",
    "retention",
    "error_search",
    "isolation",
)


def run_bench(
    *,
    quick: bool,
    redis_url: str | None,
    database_url: str | None,
    workdir: Path,
    progress: Callable[[str], None],
    plain_load: bool = False,
    scenarios: tuple[str, ...] = SCENARIOS,
) -> dict[str, Any]:
    """Run the `scenarios` (every one by default, in `SCENARIOS`' order); returns the
    figures. `plain_load`: the built-in load generator even where wrk is installed."""
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        raise ValueError(f"no such scenario: {', '.join(sorted(unknown))}")
    bench = Bench(
        quick=quick,
        workdir=workdir,
        redis_url=redis_url,
        database_url=database_url,
        progress=progress,
        plain_load=plain_load,
    )
    try:
        bench.start()
        for scenario in SCENARIOS:
            if scenario in scenarios:
                getattr(bench, scenario)()
        bench.results["machine"] = bench.machine()
        return bench.results
    finally:
        bench.close()  # the journal it made lives in `workdir`, which the caller removes
