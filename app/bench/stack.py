"""What a bench run stands on: its own Redis (or a given one), a journal, servers and
workers started and stopped by PID, and the requests it sends."""

from __future__ import annotations

import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import Engine, delete, func, select, text

from app.bench.load import LoadResult, Request, wrk_path
from app.bench.procs import CpuMeter, parent_of
from app.config.settings import Settings, load_settings
from app.intake.signing import sign
from app.journal.engine import make_engine
from app.journal.models import (
    RecordStatus,
    order_status,
    orders,
    records,
    refunds,
    replays,
)
from app.journal.schema import upgrade
from app.local.embedded_redis import RedisServer, answers
from app.local.processes import Child, Children, app_cli, free_port, listening, wait_until

# "bench" itself names the records the benchmark writes straight into its journal.
KEY_ID, SECRET = "bench-client", "bench-secret-of-16-bytes"
# Two more senders (a sender is an intake key id), for the fair shares scenario.
SHOP_A, SHOP_B = "shop-a", "shop-b"
INTAKE_KEYS = {
    KEY_ID: SECRET,
    SHOP_A: "shop-a-secret-of-16-bytes",
    SHOP_B: "shop-b-secret-of-16-bytes",
}
# Big enough that no scenario meets the bound: the bench measures the normal path.
BENCH_BOUND = 5_000_000
POOL = ("prefork", 2)
# The tables a scenario writes, emptied before each one; on PostgreSQL by one TRUNCATE of
# the same tables (a literal statement: no SQL is built from strings).
SCENARIO_TABLES = (records, replays, orders, refunds, order_status)
TRUNCATE_SCENARIO_TABLES = text("TRUNCATE records, replays, orders, refunds, order_status")


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """How long and how much each scenario runs."""

    intake_s: float
    warmup_s: float
    concurrency: int
    end_to_end: int
    replay_rows: int
    isolation_s: float
    # The journal under the status routes' pollers, and under retention.
    journal_rows: int
    # Records delivered to the downstream, at each of its delays.
    delivery: int
    # Fair shares: shop A's records posted at once, shop B's, one every 100 ms, and the
    # rounds of its three runs.
    fair_shares_flood: int
    fair_shares_late: int
    fair_shares_rounds: int

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
                journal_rows=20_000,
                delivery=200,
                fair_shares_flood=1_000,
                fair_shares_late=20,
                fair_shares_rounds=1,
            )
        return cls(
            intake_s=10,
            warmup_s=2,
            # The connections of the intake's targets (p99 at 32 connections).
            concurrency=32,
            end_to_end=20_000,
            replay_rows=1_000_000,
            isolation_s=15,
            journal_rows=1_000_000,
            delivery=2_000,
            fair_shares_flood=5_000,
            fair_shares_late=50,
            fair_shares_rounds=3,
        )


def signed_request(line: str, tag: str, body: dict[str, Any], *, key_id: str = KEY_ID) -> Request:
    """A request posting `body` to `line`, signed with `key_id`'s secret (its sender)."""
    raw = json.dumps(body).encode()
    ts = str(int(time.time()))
    nonce = f"{tag}-{body['business_no']}"
    headers = {
        "content-type": "application/json",
        "x-key-id": key_id,
        "x-timestamp": ts,
        "x-nonce": nonce,
        "x-signature": sign(INTAKE_KEYS[key_id], timestamp=ts, nonce=nonce, body=raw),
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


class BenchStack:
    """One run's servers and processes; the scenarios are in `app.bench.run`."""

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
        # Each started with the run's environment (`env`) and more: given at each start.
        self.children = Children(env={}, log_dir=workdir)
        self.own_redis: RedisServer | None = None
        self.given_redis = redis_url
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
        self.children.stop_all()
        if self.own_redis is not None:
            self.own_redis.stop()

    def cpu_of(self, **pids: int | None) -> CpuMeter:
        """A meter of `pids` (by name; those that are None left out), of the bench's own
        Redis server when it started one, and of the PostgreSQL server (its backends are
        its children) when the journal is one on this host."""
        named = {name: pid for name, pid in pids.items() if pid is not None}
        if self.own_redis is not None and self.own_redis.pid is not None:
            named["redis"] = self.own_redis.pid
        if self.postgres_pid is not None:
            named["postgres"] = self.postgres_pid
        return CpuMeter(named)

    @functools.cached_property
    def postgres_pid(self) -> int | None:
        """The PostgreSQL server's main process, when the journal is a PostgreSQL server
        on this host; else None."""
        if not self.database_url.startswith("postgresql"):
            return None
        engine = make_engine(self.database_url)
        try:
            with engine.connect() as conn:
                backend = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
                # Read while the backend lives: it exits with its connection.
                return parent_of(backend)
        finally:
            engine.dispose()

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
        env.update(
            PIPELINE_REDIS_URL=self.redis_url,
            PIPELINE_DATABASE_URL=self.database_url,
            PIPELINE_INTAKE_KEYS=json.dumps(INTAKE_KEYS),
            PIPELINE_LINES__ORDER__MAX_QUEUE_LENGTH=str(BENCH_BOUND),
            PIPELINE_LINES__STATUS__MAX_QUEUE_LENGTH=str(BENCH_BOUND),
            PIPELINE_LINES__REFUND__MAX_QUEUE_LENGTH=str(BENCH_BOUND),
        )
        env.update(extra)
        return env

    def child_settings(self, **env: str) -> Settings:
        """The settings a child started with `env` reads: the run's, not the shell's."""
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env(**env))
        try:
            return load_settings()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def start_child(self, name: str, argv: list[str], **env: str) -> Child:
        """Start `argv` as `name` (its output in `log_file(workdir, name)`), with the run's
        environment and `env`; `stop_child` stops it, and `close()` any still running."""
        return self.children.start(name, argv, env=self.env(**env))

    def stop_child(self, child: Child) -> None:
        self.children.stop(child)

    def engine(self) -> Engine:
        """A new engine on the run's journal; the caller disposes of it."""
        return make_engine(self.database_url)

    def reset(self) -> None:
        """An empty Redis and an empty journal. PostgreSQL's tables are truncated, not
        deleted from: a deleted row stays in the table and its indexes until a vacuum, and
        the server may run none (autovacuum off), so each scenario would start on the dead
        rows of the ones before it."""
        with redis.Redis.from_url(self.redis_url) as client:
            client.flushdb()
        engine = make_engine(self.database_url)
        try:
            with engine.begin() as conn:
                if engine.dialect.name == "postgresql":
                    conn.execute(TRUNCATE_SCENARIO_TABLES)
                else:
                    for table in SCENARIO_TABLES:
                        conn.execute(delete(table))
        finally:
            engine.dispose()

    @contextmanager
    def server(self, name: str, target: str, **env: str) -> Iterator[tuple[str, Child]]:
        """`target` (an app factory) under uvicorn, one process, as our intake is served
        (its protocol, which counts headers while they are read, included); `env`: more
        variables for it."""
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "uvicorn",
            "--http",
            "app.intake.protocol:GuardedHttpToolsProtocol",
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
        child = self.start_child(name, argv, **env)
        try:
            wait_until(lambda: listening(port), timeout_s=60, what=f"{name} to listen")
            yield f"http://127.0.0.1:{port}", child
        finally:
            self.stop_child(child)

    def worker(self, line: str, **env: str) -> Child:
        pool, size = POOL
        argv = app_cli("worker", line, "--pool", pool, "--concurrency", str(size))
        child = self.start_child(f"worker-{line}", argv, **env)
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

    def machine(self) -> dict[str, Any]:
        """What the run ran on, for the table's footer."""
        engine_name = self.database_url.split(":", 1)[0]
        return {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "database": engine_name,
            "load_generator": "wrk (Lua script)" if self.wrk else "asyncio (built in)",
            "quick": self.quick,
        }
