"""The fair shares scenario: one sender's flood beside another sender's trickle on the same
line (app.admission.senders).

Shop B posts its orders one every 100 ms, alone, then right after shop A has posted a
flood at once; shop A's flood is also timed alone. Both are signed with their own intake
key (a sender each), to the order line with its table sink and one worker, through one
intake. It shows what B's records wait while A's flood is on the line (B within its fair
share is taken ahead of A's records past theirs), and what serving B first costs A."""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

import httpx
from sqlalchemy import select

from app.bench.load import Request, run_load
from app.bench.stack import POOL, SHOP_A, SHOP_B, BenchStack, order_body, signed_request
from app.clock import as_utc
from app.journal.models import RecordStatus, records
from app.local.processes import wait_until

# Shop B's pace: one order every this many seconds.
LATE_INTERVAL_S = 0.1
# Shop B's orders sent, and done, before each run's measured ones: the intake's connection
# and the worker's first tasks are not what the scenario measures.
WARMUP = 5


@dataclass(frozen=True, kw_only=True)
class RunFigures:
    """What one run measured: shop B's intake → done latencies (seconds, sorted), shop A's
    records done per second from its first post to its last done, and how many of A's
    records were not yet done when B's first post was sent."""

    late_latencies_s: list[float]
    flood_records_per_s: float
    flood_posted_s: float
    flood_not_done_when_late_began: int


def fair_shares(bench: BenchStack) -> None:
    """B alone, A alone, then A's flood and B's trickle together, `fair_shares_rounds`
    times over; figures in `bench.results["fair_shares"]`. B's latencies are those of every
    round together; A's rates the median round's (one flood lasts a few seconds, and its
    rate moves by tens of percent from one to the next on a small machine)."""
    sizes = bench.sizes
    flood, late, rounds = sizes.fair_shares_flood, sizes.fair_shares_late, sizes.fair_shares_rounds
    share = bench.child_settings().lines["order"].fair_share
    # Not measured: the first flood grows the journal's file (a SQLite journal reuses the
    # pages each reset frees), which the flood measured first would pay for alone.
    _run(bench, flood=flood, late=0, what="warm-up, not measured")
    b_alone: list[RunFigures] = []
    a_alone: list[RunFigures] = []
    both: list[RunFigures] = []
    for n in range(1, rounds + 1):
        of = f", round {n} of {rounds}"
        b_alone.append(_run(bench, flood=0, late=late, what="shop B alone" + of))
        a_alone.append(_run(bench, flood=flood, late=0, what="shop A alone" + of))
        both.append(_run(bench, flood=flood, late=late, what="shop A's flood, then B" + of))
    alone = _latencies(sorted(s for run in b_alone for s in run.late_latencies_s))
    beside = _latencies(sorted(s for run in both for s in run.late_latencies_s))
    alone_rates = [run.flood_records_per_s for run in a_alone]
    beside_rates = [run.flood_records_per_s for run in both]
    alone_rate, beside_rate = statistics.median(alone_rates), statistics.median(beside_rates)
    bench.results["fair_shares"] = {
        "fair_share": share,
        "flood_records": flood,
        "late_records": late,
        "late_interval_ms": round(LATE_INTERVAL_S * 1000),
        "rounds": rounds,
        "b_alone": alone,
        "b_beside_a": beside,
        # Target: at most 2x.
        "b_p99_ratio": round(beside["p99_ms"] / alone["p99_ms"], 2) if alone["p99_ms"] else 0,
        "a_alone_records_per_s": round(alone_rate, 1),
        "a_beside_b_records_per_s": round(beside_rate, 1),
        # Target: no more than 10 % lower.
        "a_change_pct": round((beside_rate / alone_rate - 1) * 100, 1) if alone_rate else 0,
        "a_alone_rounds_records_per_s": [round(rate, 1) for rate in alone_rates],
        "a_beside_b_rounds_records_per_s": [round(rate, 1) for rate in beside_rates],
        "a_alone_posted_s": [round(run.flood_posted_s, 2) for run in a_alone],
        "a_beside_b_posted_s": [round(run.flood_posted_s, 2) for run in both],
        # Of A's records, how many were still to be done as B's first post went out.
        "a_not_done_when_b_began": [run.flood_not_done_when_late_began for run in both],
        "pool": f"{POOL[0]} {POOL[1]}",
    }


def _run(bench: BenchStack, *, flood: int, late: int, what: str) -> RunFigures:
    """One run on an empty Redis and journal, its own order worker and intake: shop A posts
    `flood` orders at once (as fast as the load generator sends them), then shop B posts
    `late`, one every `LATE_INTERVAL_S`; waits until every one is done."""
    bench.reset()
    posts = [f"{flood:,} orders of A at once"] if flood else []
    posts += [f"{late} of B one every {LATE_INTERVAL_S * 1000:.0f} ms"] if late else []
    bench.progress(f"fair shares: {what} ({', then '.join(posts)})")
    flood_tag, late_tag = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    # Signed before the clock starts: the client's work is not the pipeline's.
    flood_requests = [
        signed_request("order", flood_tag, order_body(n, flood_tag), key_id=SHOP_A)
        for n in range(flood)
    ]
    worker = bench.worker("order")
    try:
        with bench.server("intake-fair-shares", "app.intake.asgi:app_from_env") as (url, _child):
            with httpx.Client(base_url=url, timeout=30) as client:
                _trickle(client, f"{late_tag}w", WARMUP, interval_s=0)  # not measured
                _wait_done(bench, WARMUP)
                flood_began = time.time()
                posted_s = _flood(bench, url, flood_requests)
                late_began = time.time()
                posted_at = _trickle(client, late_tag, late, interval_s=LATE_INTERVAL_S)
            _wait_done(bench, WARMUP + flood + late)
    finally:
        bench.stop_child(worker)
    finished = _finished(bench, flood_tag, late_tag)
    flood_done = [at for tag, at in finished if tag == flood_tag]
    late_done = {tag: at for tag, at in finished if tag != flood_tag}
    latencies = sorted(late_done[key] - at for key, at in posted_at.items())
    return RunFigures(
        late_latencies_s=latencies,
        flood_records_per_s=(
            len(flood_done) / (max(flood_done) - flood_began) if flood_done else 0.0
        ),
        flood_posted_s=posted_s,
        flood_not_done_when_late_began=sum(1 for at in flood_done if at > late_began),
    )


def _flood(bench: BenchStack, url: str, requests: list[Request]) -> float:
    """Post `requests` at once, from the load generator's connections; seconds it took."""
    if not requests:
        return 0.0
    started = time.monotonic()
    result = run_load(
        url,
        requests.__getitem__,
        concurrency=bench.sizes.concurrency,
        duration_s=3600,
        total=len(requests),
    )
    accepted = sum(n for status, n in result.statuses.items() if 200 <= status < 300)
    if accepted != len(requests) or result.errors:
        raise RuntimeError(
            f"the flood's posts: {accepted} of {len(requests)} accepted, "
            f"{result.errors} errors ({dict(result.statuses)})"
        )
    return time.monotonic() - started


def _trickle(client: httpx.Client, tag: str, count: int, *, interval_s: float) -> dict[str, float]:
    """Post `count` orders of shop B, one every `interval_s` (on a fixed schedule, so that
    a slow answer does not slow the pace); each business number's wall-clock time just
    before its post (the journal's `finished_at` is wall clock too)."""
    posted: dict[str, float] = {}
    began = time.monotonic()
    for n in range(count):
        pause = began + n * interval_s - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        body = order_body(n, tag)
        method, path, headers, raw = signed_request("order", tag, body, key_id=SHOP_B)
        posted[body["business_no"]] = time.time()
        answer = client.request(method, path, headers=headers, content=raw)
        if answer.status_code != 202:
            raise RuntimeError(f"shop B's post answered {answer.status_code}: {answer.text}")
    return posted


def _wait_done(bench: BenchStack, count: int) -> None:
    """Wait until the journal has `count` order records done."""
    wait_until(
        lambda: bench.journal_count(line="order", status=RecordStatus.DONE) >= count,
        timeout_s=max(120, count / 20),
        what=f"{count} order records to be done",
    )


def _finished(bench: BenchStack, flood_tag: str, late_tag: str) -> list[tuple[str, float]]:
    """(the flood's tag, or B's business number; when it was done, as a Unix time) of each
    measured record of the run."""
    engine = bench.engine()
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(records.c.business_no, records.c.finished_at).where(
                    records.c.line == "order",
                    records.c.business_no.like(f"{flood_tag}-%")
                    | records.c.business_no.like(f"{late_tag}-%"),
                )
            ).all()
    finally:
        engine.dispose()
    found: list[tuple[str, float]] = []
    for business_no, finished_at in rows:
        at = _unix(finished_at)
        found.append((flood_tag if business_no.startswith(f"{flood_tag}-") else business_no, at))
    return found


def _unix(moment: datetime) -> float:
    return as_utc(moment).timestamp()


def _latencies(latencies_s: list[float]) -> dict[str, float]:
    """p50, p99 and max of sorted latencies, in ms (of 50, p99 is the largest)."""
    if not latencies_s:
        return {"records": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    count = len(latencies_s)
    return {
        "records": count,
        "p50_ms": round(latencies_s[count // 2] * 1000, 1),
        "p99_ms": round(latencies_s[min(count - 1, int(0.99 * count))] * 1000, 1),
        "max_ms": round(latencies_s[-1] * 1000, 1),
    }
