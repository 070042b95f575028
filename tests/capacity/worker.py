"""Capacity: what one line's worker delivers per second toward a downstream of a given
latency, measured.

A real downstream (an HTTP server on loopback that answers 200 after a fixed delay), a real
worker (`pipeline worker order --pool prefork --concurrency C`, the order line's HTTP sink
pointed at that server), records journaled and pushed by the product's own functions.
From the rate and the worker's CPU time follow the per-attempt overhead and, by Little's
law, the pool processes a rate needs (`tests.capacity.paper`)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import func, select

from app.admission.push import Pusher
from app.bench.procs import children, cpu_s
from app.journal import store
from app.journal.engine import make_engine
from app.journal.journal import Journal
from app.journal.models import RecordStatus, records
from app.local.processes import STOP_TIMEOUT_S, Child, app_cli, log_file, wait_until
from app.observe.liveness import PREFIX
from tests.capacity.journal import new_record

# Records pushed per call, as the intake's group commit pushes them.
PUSH_GROUP = 256
# Records each pool process delivers before the measurement starts, and where their
# business numbers start (apart from the measured ones).
WARMUP_PER_PROCESS = 3
WARMUP_FIRST = 50_000_000
# Clock ticks per second of /proc/<pid>/stat's CPU times.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, kw_only=True)
class WorkerRun:
    """One measurement: a downstream answering after `latency_ms`, a worker of
    `concurrency` pool processes, `records` records."""

    latency_ms: int
    concurrency: int
    records: int


class _Downstream(ThreadingHTTPServer):
    daemon_threads = True
    # A burst of connections fits in the listen backlog (the default, 5, drops SYNs that
    # the client's kernel sends again a second later: a second counted as latency).
    request_queue_size = 128

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.keys: list[str] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Answer)


class _Answer(BaseHTTPRequestHandler):
    server: _Downstream
    protocol_version = "HTTP/1.1"
    # Buffered, so that the headers and the body leave in one segment: written apart on a
    # kept-alive connection, Nagle's algorithm holds the body until the client's delayed
    # ACK (some 40 ms), which would pass for the downstream's latency.
    wbufsize = 64 * 1024

    def setup(self) -> None:
        super().setup()
        # No Nagle either: an answer leaves as soon as it is written.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        time.sleep(self.server.delay_s)
        with self.server.lock:
            self.server.keys.append(self.headers.get("idempotency-key", ""))
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        return


@contextmanager
def downstream(delay_s: float) -> Iterator[tuple[str, _Downstream]]:
    """An HTTP server on loopback answering every POST with 200 after `delay_s`."""
    server = _Downstream(delay_s)
    thread = threading.Thread(target=server.serve_forever, name="downstream", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/orders", server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def pss_mib(pid: int) -> float:
    """The proportional set size of `pid` in MiB: its private memory plus its share of
    what it shares (a forked pool process shares its parent's pages), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for row in rollup:
                if row.startswith("Pss:"):
                    return int(row.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _done(journal: Journal) -> int:
    query = select(func.count()).where(records.c.status == RecordStatus.DONE.value)
    with journal.reading() as conn:
        return int(conn.execute(query).scalar_one())


def _journal_and_push(journal: Journal, pusher: Pusher, first: int, count: int) -> None:
    """Journal `count` order records, then push them and mark them `enqueued` group by
    group, as the intake does."""
    now = datetime.now(UTC)
    news = [new_record(n, now) for n in range(first, first + count)]
    with journal.transaction() as conn:
        store.insert_records(conn, news, now=now)
    for start in range(0, count, PUSH_GROUP):
        group = news[start : start + PUSH_GROUP]
        ids = [new.id for new in group]
        result = pusher.push(
            "order", ids, max_length=count, business_nos=[n.business_no for n in group]
        )
        with journal.transaction() as conn:
            store.mark_enqueued(conn, ids, epoch=result.epoch, now=datetime.now(UTC))


def measure_worker(
    run: WorkerRun,
    *,
    redis_url: str,
    database_url: str,
    workdir: Path,
    progress: Callable[[str], None],
    first: int = 0,
) -> dict[str, Any]:
    """Deliver `run.records` records (business numbers from `first` on) through one
    worker toward a downstream answering after `run.latency_ms`; the rate, the worker's
    CPU seconds per record, and how many POSTs the downstream got."""
    engine = make_engine(database_url)
    journal = Journal(engine)
    client = redis.Redis.from_url(redis_url)
    name = f"worker-{run.latency_ms}ms-c{run.concurrency}"
    child = Child(name, _argv(run.concurrency), log_path=log_file(workdir, name))
    try:
        with downstream(run.latency_ms / 1000) as (url, server):
            child.start(_env(redis_url, database_url, url))
            wait_until(
                lambda: any(client.scan_iter(match=f"{PREFIX}:order:*")),
                timeout_s=60,
                what="the worker's heartbeat",
            )
            assert child.process is not None
            pid = child.process.pid
            # A warm-up: every pool process started, connected and past its first record.
            warm = WARMUP_PER_PROCESS * run.concurrency
            before_done = _done(journal)
            _journal_and_push(journal, Pusher(client), WARMUP_FIRST + first, warm)
            wait_until(
                lambda: _done(journal) - before_done >= warm,
                timeout_s=60 + warm * run.latency_ms / 1000,
                what="the warm-up records to be delivered",
            )
            server.keys.clear()
            before_done, cpu_before = _done(journal), cpu_s(pid)
            progress(
                f"worker: {run.records} records, downstream {run.latency_ms} ms, "
                f"{run.concurrency} pool processes"
            )
            started = time.monotonic()
            _journal_and_push(journal, Pusher(client), first, run.records)
            wait_until(
                lambda: _done(journal) - before_done >= run.records,
                timeout_s=max(60.0, run.records * (run.latency_ms / 1000 + 0.1)),
                what=f"{run.records} records to be delivered",
            )
            seconds = time.monotonic() - started
            cpu = cpu_s(pid) - cpu_before
            pool = children(pid)
            parent_mib = pss_mib(pid)
            pool_mib = sum(pss_mib(p) for p in pool) / max(1, len(pool))
            posts = len(server.keys)
            distinct = len(set(server.keys))
    finally:
        child.stop(timeout_s=STOP_TIMEOUT_S)
        client.close()
        engine.dispose()
    return {
        "latency_ms": run.latency_ms,
        "concurrency": run.concurrency,
        "records": run.records,
        "seconds": round(seconds, 2),
        "records_per_s": round(run.records / seconds, 1),
        "worker_cpu_ms_per_record": round(cpu * 1000 / run.records, 2),
        "pss_mib_parent": round(parent_mib, 1),
        "pss_mib_per_pool_process": round(pool_mib, 1),
        "downstream_posts": posts,
        "downstream_distinct_keys": distinct,
    }


def _argv(concurrency: int) -> list[str]:
    return app_cli(
        "worker", "order", "--pool", "prefork", "--concurrency", str(concurrency), "--quiet"
    )


def _env(redis_url: str, database_url: str, downstream_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env.update(
        PIPELINE_REDIS_URL=redis_url,
        PIPELINE_DATABASE_URL=database_url,
        PIPELINE_INTAKE_KEYS=json.dumps({"capacity": "capacity-secret-16-bytes"}),
        PIPELINE_LINES__ORDER__DOWNSTREAM_URL=downstream_url,
        PIPELINE_LINES__ORDER__MAX_QUEUE_LENGTH="1000000",
    )
    return env
