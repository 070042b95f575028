"""Scenarios of the journal: the intake's latency while pollers read the status routes of
a large journal, and while retention purges one, each beside the intake alone in the same
run and on the same journal; and the records API's search by an error's words on one."""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, func, insert, select, text

from app.bench.load import LoadResult, Request, merged, run_load
from app.bench.stack import BenchStack, load_figures, order_body, signed_request
from app.config.settings import load_settings
from app.journal import attempt_log, store
from app.journal.models import RecordStatus, Source, records
from app.journal.store import RecordFilter
from app.local.processes import log_file, wait_until
from app.recovery.record_actions import RecordActions
from app.wiring.runtime import Runtime

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
# The error search's journal: one record in ERROR_EVERY has an error, RARE_RECORDS of those
# a word no other error holds, the others COMMON_WORDS; its records of these lines in turn.
ERROR_EVERY = 20
RARE_RECORDS = 40
RARE_WORD = "Zebrafish"
COMMON_WORDS = "unknown sku"
SEARCH_LINES = ("order", "refund", "status")
# Each query of the error search: the median of this many runs, pages of this many records.
SEARCH_RUNS = 5
SEARCH_PAGE = 100


def fill_journal(
    engine: Engine,
    rows: int,
    *,
    status: RecordStatus,
    at: datetime,
    finished_at: datetime | None = None,
    next_attempt_at: datetime | None = None,
    varied: Callable[[int], dict[str, Any]] | None = None,
) -> None:
    """Write `rows` records of the order line in `status`, created and changed `at`;
    `varied(n)`: the columns of the `n`-th record that differ from those (its line, its
    status, its `last_error`)."""
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
                    | (varied(n) if varied else {})
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
    polls = json.loads(log_file(bench.workdir, "pollers").read_text().strip().splitlines()[-1])
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
        raise RuntimeError(f"the purge failed: see {log_file(bench.workdir, 'purge')}")
    done = json.loads(log_file(bench.workdir, "purge").read_text().strip().splitlines()[-1])
    bench.results["retention"] = {
        "rows": rows,
        "deleted": done["deleted"],
        "seconds": done["seconds"],
        "rows_per_s": round(done["deleted"] / done["seconds"], 1) if done["seconds"] else 0.0,
        "alone": load_figures(alone),
        "during": load_figures(merged(slices)),
    }


def _errors(rows: int) -> Callable[[int], dict[str, Any]]:
    """The columns of the `n`-th record of the error search's journal: of the lines in
    turn; one in `ERROR_EVERY` `failed` or `dead` with an error, `RARE_RECORDS` of those
    (spread over the journal) holding `RARE_WORD`, the others `COMMON_WORDS`; the rest
    `done`."""
    rare_every = max(ERROR_EVERY, rows // RARE_RECORDS // ERROR_EVERY * ERROR_EVERY)

    def varied(n: int) -> dict[str, Any]:
        line = SEARCH_LINES[n % len(SEARCH_LINES)]
        if n % ERROR_EVERY:
            return {"line": line, "status": RecordStatus.DONE.value, "last_error": None}
        said = RARE_WORD if n % rare_every == 0 else f"{COMMON_WORDS} {n % 977}"
        dead = n % (2 * ERROR_EVERY) == 0
        return {
            "line": line,
            "status": (RecordStatus.DEAD if dead else RecordStatus.FAILED).value,
            "finished_at": None,
            "last_error": (
                "DeliveryFailed: POST /v1/orders: HTTP 422: "
                + json.dumps({"error": f"{said} in the order"})
            ),
        }

    return varied


def _median_ms(run: Callable[[], Any]) -> tuple[float, Any]:
    """The median of `SEARCH_RUNS` runs of `run`, in ms, and what its last run returned."""
    times, result = [], None
    for _ in range(SEARCH_RUNS):
        began = time.perf_counter()
        result = run()
        times.append((time.perf_counter() - began) * 1000)
    return round(statistics.median(times), 2), result


def error_search(bench: BenchStack) -> None:
    """`GET /v1/records?error=…` on a large journal, one in `ERROR_EVERY` records with an
    error: a page of `store.find_records` and its records' last attempts, as the route
    reads them, for a rare word, a common one and no error filter; and the count of a
    bulk retry's dry run. The median of `SEARCH_RUNS` runs of each."""
    rows = bench.sizes.journal_rows
    bench.reset()
    bench.progress(
        f"error_search: filling the journal with {rows:,} records, 1 in {ERROR_EVERY} "
        f"with an error, {RARE_RECORDS} of those with a rare word"
    )
    began = time.monotonic()
    engine = bench.engine()
    try:
        at = datetime.now(UTC) - timedelta(hours=1)
        fill_journal(
            engine, rows, status=RecordStatus.DONE, at=at, finished_at=at, varied=_errors(rows)
        )
        if engine.dialect.name == "postgresql":
            # What autovacuum would do after such an insert; the bench's server may run
            # none. The pipeline never analyzes a SQLite journal, nor does the bench.
            with engine.begin() as conn:
                conn.execute(text("ANALYZE records"))
        with engine.connect() as conn:
            errored = records.c.last_error.is_not(None)
            with_error = conn.execute(select(func.count()).where(errored)).scalar_one()
    finally:
        engine.dispose()
    filled_s = time.monotonic() - began
    rt = Runtime.build(load_settings(redis_url=bench.redis_url, database_url=bench.database_url))
    try:
        figures = _searches(rt)
    finally:
        rt.close()
    bench.results["error_search"] = {
        "rows": rows,
        "with_error": with_error,
        "fill_seconds": round(filled_s, 1),
        "runs": SEARCH_RUNS,
        "page": SEARCH_PAGE,
        **figures,
    }


def _searches(rt: Runtime) -> dict[str, Any]:
    """Each search's median ms, records found and pages read; the dry run's median ms and
    counts."""

    def search(where: RecordFilter, *, newest: bool = False, to_end: bool = False) -> Any:
        found, pages, after = 0, 0, None
        with rt.journal.reading() as conn:
            while True:
                page = store.find_records(
                    conn, where, limit=SEARCH_PAGE, after=after, newest=newest
                )
                attempt_log.last_attempts(conn, [record.id for record in page.items])
                found, pages, after = found + len(page.items), pages + 1, page.next
                if not to_end or after is None:
                    return {"found": found, "pages": pages}

    rare = RecordFilter(error_text=RARE_WORD.upper())
    narrow = RecordFilter(error_text=RARE_WORD.upper(), line="order", statuses=[RecordStatus.DEAD])
    runs: dict[str, Callable[[], Any]] = {
        "rare_oldest": functools.partial(search, rare),
        "rare_newest": functools.partial(search, rare, newest=True),
        "rare_to_end": functools.partial(search, rare, to_end=True),
        "rare_line_dead": functools.partial(search, narrow, to_end=True),
        "common_first_page": functools.partial(search, RecordFilter(error_text=COMMON_WORDS)),
        "no_error_filter": functools.partial(
            search, RecordFilter(line="order", statuses=[RecordStatus.DEAD]), newest=True
        ),
    }
    figures: dict[str, Any] = {}
    for name, run in runs.items():
        median, found = _median_ms(run)
        figures[name] = {"median_ms": median, **found}
    actions = RecordActions(journal=rt.journal, pusher=rt.pusher, lines=rt.lines, paused=rt.paused)
    median, counts = _median_ms(
        functools.partial(
            actions.bulk,
            narrow,
            cancel=False,
            dry_run=True,
            actor="bench",
            reason=None,
            clock=lambda: datetime.now(UTC),
        )
    )
    figures["dry_run"] = {"median_ms": median, "matched": counts.matched, "acted": counts.acted}
    return figures
