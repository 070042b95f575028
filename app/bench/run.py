"""`pipeline bench` (DESIGN §12): each scenario beside its reference, measured in one run.

It starts what it needs: its own Redis-compatible server on a free port (unless given
one, whose database it flushes), a journal (a fresh SQLite file unless given a database,
whose pipeline tables it empties), intake servers, workers. Benchmarks report figures;
nothing here passes or fails on speed."""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import redis
from sqlalchemy import delete, func, insert, select

from app.admission import build_message
from app.bench.load import LoadResult, Request, run_load, run_wrk, wrk_path
from app.bench.procs import RssSampler, free_port, listening, log_path, wait_until
from app.bench.reference import NOOP_QUEUE, NOOP_TASK
from app.embedded_redis import RedisServer, answers
from app.intake.signing import sign
from app.journal.engine import make_engine
from app.journal.models import (
    RecordStatus,
    Source,
    order_status,
    orders,
    records,
    refunds,
    replays,
)
from app.journal.schema import upgrade
from app.replay import ReplayFilter, replay
from app.runtime import Runtime
from app.settings import load_settings
from app.supervisor import STOP_TIMEOUT_S, Child

KEY_ID, SECRET = "bench", "bench-secret"
# Big enough that no scenario meets the bound: the bench measures the normal path.
BENCH_BOUND = 5_000_000
POOL = ("prefork", 2)
# Requests made ahead for wrk, per second of its run: above what any endpoint here serves
# signed and journaled, so each request has its own nonce (the bare endpoint, faster,
# takes them again in turn; it reads no nonce).
WRK_REQUESTS_PER_S = 4_000


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """How long and how much each scenario runs."""

    intake_s: float
    warmup_s: float
    concurrency: int
    end_to_end: int
    replay_rows: int
    isolation_s: float

    @classmethod
    def for_run(cls, *, quick: bool) -> Sizes:
        if quick:
            return cls(
                intake_s=2,
                warmup_s=0.5,
                concurrency=16,
                end_to_end=1_000,
                replay_rows=20_000,
                isolation_s=3,
            )
        return cls(
            intake_s=10,
            warmup_s=2,
            concurrency=16,
            end_to_end=20_000,
            replay_rows=1_000_000,
            isolation_s=15,
        )


def signed_request(line: str, tag: str, body: dict[str, Any]) -> Request:
    raw = json.dumps(body).encode()
    ts = str(int(time.time()))
    nonce = f"{tag}-{body['business_no']}"
    headers = {
        "content-type": "application/json",
        "x-key-id": KEY_ID,
        "x-timestamp": ts,
        "x-nonce": nonce,
        "x-signature": sign(SECRET, timestamp=ts, nonce=nonce, body=raw),
    }
    return ("POST", f"/v1/{line}", headers, raw)


def plain_request(line: str, body: dict[str, Any]) -> Request:
    return ("POST", f"/v1/{line}", {"content-type": "application/json"}, json.dumps(body).encode())


def order_body(n: int, tag: str) -> dict[str, Any]:
    return {"business_no": f"{tag}-{n}", "amount": 42, "currency": "EUR"}


def load_figures(result: LoadResult) -> dict[str, Any]:
    ok = sum(n for status, n in result.statuses.items() if 200 <= status < 300)
    return {
        "requests_per_s": round(result.rate, 1),
        "p50_ms": round(result.percentile(0.50) * 1000, 2),
        "p99_ms": round(result.percentile(0.99) * 1000, 2),
        "requests": result.requests,
        "non_2xx": result.requests - ok,
        "errors": result.errors,
    }


class Bench:
    """One run: its servers, its processes, its figures."""

    def __init__(
        self,
        *,
        quick: bool,
        workdir: Path,
        redis_url: str | None,
        database_url: str | None,
        progress: Callable[[str], None],
        plain_load: bool = False,
    ) -> None:
        self.sizes = Sizes.for_run(quick=quick)
        self.quick = quick
        self.workdir = workdir
        self.progress = progress
        self.children: list[Child] = []
        self.own_redis: RedisServer | None = None
        self.given_redis = redis_url
        self.given_database = database_url
        self.redis_url = redis_url or ""
        self.database_url = database_url or f"sqlite:///{workdir / 'journal.db'}"
        self.results: dict[str, Any] = {}
        self.wrk = wrk_path() is not None and not plain_load

    # Set-up and tear-down.

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.given_redis is None:
            self.own_redis = RedisServer(port=free_port(), workdir=self.workdir)
            self.own_redis.start()
            self.redis_url = self.own_redis.url
        elif not answers(self.given_redis):
            raise RuntimeError(f"no Redis answers at {self.given_redis}")
        engine = make_engine(self.database_url)
        try:
            upgrade(engine)
        finally:
            engine.dispose()

    def close(self) -> None:
        for child in reversed(self.children):
            child.stop(timeout_s=STOP_TIMEOUT_S)
        self.children.clear()
        if self.own_redis is not None:
            self.own_redis.stop()

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
        env.update(
            PIPELINE_REDIS_URL=self.redis_url,
            PIPELINE_DATABASE_URL=self.database_url,
            PIPELINE_INTAKE_KEYS=json.dumps({KEY_ID: SECRET}),
            PIPELINE_LINES__ORDER__MAX_QUEUE_LENGTH=str(BENCH_BOUND),
            PIPELINE_LINES__STATUS__MAX_QUEUE_LENGTH=str(BENCH_BOUND),
            PIPELINE_LINES__REFUND__MAX_QUEUE_LENGTH=str(BENCH_BOUND),
        )
        env.update(extra)
        return env

    def _start(self, name: str, argv: list[str], **env: str) -> Child:
        child = Child(name, argv, log_path=log_path(self.workdir, name))
        child.start(self.env(**env))
        self.children.append(child)
        return child

    def _stop(self, child: Child) -> None:
        child.stop(timeout_s=STOP_TIMEOUT_S)
        self.children.remove(child)

    def reset(self) -> None:
        """An empty Redis and an empty journal."""
        with redis.Redis.from_url(self.redis_url) as client:
            client.flushdb()
        engine = make_engine(self.database_url)
        try:
            with engine.begin() as conn:
                for table in (records, replays, orders, refunds, order_status):
                    conn.execute(delete(table))
        finally:
            engine.dispose()

    @contextmanager
    def server(self, name: str, target: str) -> Iterator[tuple[str, Child]]:
        """`target` (an app factory) under uvicorn, one process, as our intake is served."""
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            target,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--log-level",
            "warning",
            "--no-access-log",
        ]
        child = self._start(name, argv)
        try:
            wait_until(lambda: listening(port), timeout_s=60, what=f"{name} to listen")
            yield f"http://127.0.0.1:{port}", child
        finally:
            self._stop(child)

    def worker(self, line: str) -> Child:
        pool, size = POOL
        argv = [sys.executable, "-m", "app.cli", "worker", line, "--pool", pool]
        child = self._start(f"worker-{line}", [*argv, "--concurrency", str(size)])
        with redis.Redis.from_url(self.redis_url) as client:
            wait_until(
                lambda: any(client.scan_iter(match=f"pipeline:workers:{line}:*")),
                timeout_s=60,
                what=f"the {line} worker's heartbeat",
            )
        return child

    def journal_count(self, *, line: str, status: RecordStatus | None = None) -> int:
        engine = make_engine(self.database_url)
        try:
            query = select(func.count()).select_from(records).where(records.c.line == line)
            if status is not None:
                query = query.where(records.c.status == status.value)
            with engine.connect() as conn:
                return int(conn.execute(query).scalar_one())
        finally:
            engine.dispose()

    # The scenarios.

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
                with RssSampler(child.process.pid) as rss:
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
                if name == "ours":
                    self.results.setdefault("memory", {})["intake"] = rss.summary()
        figures["concurrency"] = sizes.concurrency
        self.results["intake"] = figures

    def end_to_end(self) -> None:
        count = self.sizes.end_to_end
        self.reset()
        self.progress(f"end to end: {count} records through intake and an order worker")
        worker = self.worker("order")
        tag = uuid.uuid4().hex[:8]
        with self.server("intake-e2e", "app.intake.asgi:app_from_env") as (url, _child):
            assert worker.process is not None
            with RssSampler(worker.process.pid, include_children=True) as rss:
                started = time.monotonic()
                run_load(
                    url,
                    lambda n: signed_request("order", tag, order_body(n, tag)),
                    concurrency=self.sizes.concurrency,
                    duration_s=3600,
                    total=count,
                )
                posted_s = time.monotonic() - started
                wait_until(
                    lambda: self.journal_count(line="order", status=RecordStatus.DONE) >= count,
                    timeout_s=max(120, count / 20),
                    what=f"{count} records to be done",
                )
                ours_s = time.monotonic() - started
        self._stop(worker)
        self.results.setdefault("memory", {})["worker"] = rss.summary()
        self.progress(f"end to end: bare Celery no-op drain of {count} tasks")
        self.reset()
        drain_s = self._celery_drain(count)
        self.results["end_to_end"] = {
            "records": count,
            "ours_records_per_s": round(count / ours_s, 1),
            "ours_intake_s": round(posted_s, 2),
            "celery_noop_per_s": round(count / drain_s, 1),
            "pool": f"{POOL[0]} {POOL[1]}",
        }

    def _celery_drain(self, count: int) -> float:
        pool, size = POOL
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "app.bench.reference:celery",
            "worker",
            "-Q",
            NOOP_QUEUE,
            "--pool",
            pool,
            "--concurrency",
            str(size),
            "--without-mingle",
            "--without-gossip",
            "--loglevel",
            "INFO",
        ]
        child = self._start("celery-noop", argv)
        log = log_path(self.workdir, "celery-noop")
        try:
            wait_until(lambda: " ready." in log.read_text(), timeout_s=60, what="the no-op worker")
            with redis.Redis.from_url(self.redis_url) as client:
                messages = [
                    build_message(f"noop-{n}", queue=NOOP_QUEUE, origin="bench", task=NOOP_TASK)
                    for n in range(count)
                ]
                started = time.monotonic()
                with client.pipeline(transaction=False) as pipe:
                    for chunk in range(0, count, 1000):
                        pipe.lpush(NOOP_QUEUE, *messages[chunk : chunk + 1000])
                    pipe.execute()
                wait_until(
                    lambda: client.llen(NOOP_QUEUE) == 0 and client.hlen("unacked") == 0,
                    timeout_s=max(120, count / 20),
                    what="the no-op queue to drain",
                )
                return time.monotonic() - started
        finally:
            self._stop(child)

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
            self._fill(rt, rows)
            self.progress(f"replay: re-enqueueing {rows:,} records")
            started = time.monotonic()
            counts = replay(
                rt,
                ReplayFilter(line="order", statuses=(RecordStatus.FAILED,)),
                dry_run=False,
                actor="bench",
                clock=lambda: datetime.now(UTC),
            )
            seconds = time.monotonic() - started
        finally:
            rt.close()
        self.results["replay"] = {
            "rows": rows,
            "enqueued": counts.enqueued,
            "seconds": round(seconds, 2),
            "records_per_s": round(rows / seconds, 1),
        }

    def _fill(self, rt: Runtime, rows: int) -> None:
        now = datetime.now(UTC) - timedelta(hours=1)
        batch = 10_000
        with rt.engine.begin() as conn:
            for start in range(0, rows, batch):
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
                            "status": RecordStatus.FAILED.value,
                            "attempts": 1,
                            "created_at": now,
                            "updated_at": now,
                            "next_attempt_at": now + timedelta(days=1),
                            "task_id": f"{n:026d}",
                        }
                        for n in range(start, min(rows, start + batch))
                    ],
                )

    def isolation(self) -> None:
        seconds = self.sizes.isolation_s
        self.reset()
        order = self.worker("order")
        status = self.worker("status")
        with self.server("intake-isolation", "app.intake.asgi:app_from_env") as (url, _child):
            self._order_latencies(url, 1, tag="warmup")  # connections, caches: not measured
            self.progress(f"isolation: order line alone, {seconds:.0f} s")
            alone = self._order_latencies(url, seconds, tag="alone")
            self.progress(
                f"isolation: order line while the status line is flooded, {seconds:.0f} s"
            )
            flood_tag = uuid.uuid4().hex[:8]
            flood = threading.Thread(
                target=run_load,
                args=(
                    url,
                    lambda n: signed_request(
                        "status",
                        flood_tag,
                        {
                            "business_no": f"{flood_tag}-{n}",
                            "status": "paid",
                            "occurred_at": "2026-11-29T10:00:00Z",
                        },
                    ),
                ),
                kwargs={"concurrency": 8, "duration_s": seconds + 1},
                daemon=True,
            )
            flood.start()
            time.sleep(1)
            flooded = self._order_latencies(url, seconds, tag="flooded")
            flood.join(timeout=seconds + 60)
            status_waiting = self.journal_count(line="status") - self.journal_count(
                line="status", status=RecordStatus.DONE
            )
        self._stop(order)
        self._stop(status)
        self.results["isolation"] = {
            "alone": alone,
            "flooded": flooded,
            "status_records_posted": self.journal_count(line="status"),
            "status_records_unfinished": status_waiting,
        }

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

    def machine(self) -> dict[str, Any]:
        engine_name = self.database_url.split(":", 1)[0]
        return {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "database": engine_name,
            "load_generator": "wrk (Lua script)" if self.wrk else "asyncio (built in)",
            "quick": self.quick,
        }


def _offset(make: Callable[[int], Request], offset: int, n: int) -> Request:
    return make(n + offset)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


SCENARIOS = ("intake", "end_to_end", "replay", "isolation")


def run_bench(
    *,
    quick: bool,
    redis_url: str | None,
    database_url: str | None,
    workdir: Path,
    progress: Callable[[str], None],
    plain_load: bool = False,
) -> dict[str, Any]:
    """Run every scenario; returns the figures. `plain_load`: the built-in load generator
    even where wrk is installed."""
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
            getattr(bench, scenario)()
        bench.results["machine"] = bench.machine()
        return bench.results
    finally:
        bench.close()
        if database_url is None:
            shutil.rmtree(workdir / "journal.db", ignore_errors=True)
