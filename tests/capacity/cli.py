"""`python -m tests.capacity`: the figures behind docs/capacity.md, measured again.

Parts (each may run alone, so that none loads the machine for long):
- `journal`: bytes per record and per attempt, each table and index, on each database
  given (`--database-url`, repeatable: `sqlite` for a fresh SQLite file, or a PostgreSQL
  server's URL, on which a scratch database is made and dropped);
- `redis`: Redis memory per 10,000 waiting messages;
- `worker`: one worker's rate toward a downstream answering after 0, 50 and 200 ms;
- `intake`: the intake's CPU time per request.
The worker and the intake run on the first database given. Figures are printed as JSON
(and saved with `--save`); `plan` carries them to 10 million records a day."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from sqlalchemy.exc import SQLAlchemyError

from app.errors import PipelineError
from tests.capacity import paper
from tests.capacity.intake import measure_intake
from tests.capacity.journal import measure_journal, scratch_database
from tests.capacity.redis_memory import measure_waiting, redis_server
from tests.capacity.worker import WorkerRun, measure_worker

PARTS = ("journal", "redis", "worker", "intake")
# The worker's runs: (downstream latency in ms, pool processes, share of --worker-records).
# At 0 ms one process, so that its rate is the overhead alone; then enough processes to
# keep the CPU busy while they wait.
WORKER_RUNS = ((0, 1, 1.0), (50, 4, 1.0), (200, 8, 0.5))
# Records per message measured in Redis: one (an HTTP sink, a handler) and the table
# sink's default.
MESSAGE_BATCHES = (1, 16)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.capacity", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--database-url",
        action="append",
        default=None,
        help="sqlite, or a PostgreSQL server's URL (a scratch database is made there); "
        "repeat for several; default: sqlite",
    )
    parser.add_argument("--part", action="append", choices=PARTS, help="default: every part")
    parser.add_argument("--records", type=_positive, default=100_000, help="journal records")
    parser.add_argument("--messages", type=_positive, default=10_000, help="waiting messages")
    parser.add_argument("--worker-records", type=_positive, default=600)
    parser.add_argument("--requests", type=_positive, default=3_000, help="intake requests")
    parser.add_argument("--save", type=Path, help="also write the figures here, as JSON")
    parser.add_argument(
        "--combine",
        action="append",
        type=Path,
        help="measure nothing: merge these saved figures (repeat) and add the plan",
    )
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Run the parts `args` names; their figures, with the machine and the date."""
    parts = args.part or PARTS
    databases = args.database_url or ["sqlite"]
    figures: dict[str, Any] = {"measured_at": datetime.now(UTC).isoformat(timespec="seconds")}
    figures["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    figures["command"] = "python -m tests.capacity " + " ".join(sys.argv[1:])

    def progress(message: str) -> None:
        print(f"capacity: {message}", file=sys.stderr, flush=True)

    if "journal" in parts:
        figures["journal"] = []
        for url in databases:
            with scratch_database(url, workdir) as scratch:
                progress(f"journal: {args.records:,} records on {scratch.split(':', 1)[0]}")
                figures["journal"].append(
                    measure_journal(scratch, records=args.records, progress=progress)
                )
    if not {"redis", "worker", "intake"} & set(parts):
        return figures
    with redis_server(workdir) as (redis_url, server):
        figures["redis_server"] = server
        if "redis" in parts:
            figures["redis"] = [
                measure_waiting(redis_url, messages=args.messages, batch_size=size)
                for size in MESSAGE_BATCHES
            ]
        if {"worker", "intake"} & set(parts):
            with scratch_database(databases[0], workdir) as scratch:
                figures["runs_on"] = scratch.split(":", 1)[0]
                if "worker" in parts:
                    figures["worker"] = _worker_runs(args, redis_url, scratch, workdir, progress)
                if "intake" in parts:
                    figures["intake"] = measure_intake(
                        redis_url=redis_url,
                        database_url=scratch,
                        workdir=workdir,
                        requests=args.requests,
                        progress=progress,
                    )
    return figures


def _worker_runs(
    args: argparse.Namespace, redis_url: str, database_url: str, workdir: Path, progress: Any
) -> list[dict[str, Any]]:
    results, first = [], 0
    for latency_ms, concurrency, share in WORKER_RUNS:
        count = max(1, int(args.worker_records * share))
        run = WorkerRun(latency_ms=latency_ms, concurrency=concurrency, records=count)
        results.append(
            measure_worker(
                run,
                redis_url=redis_url,
                database_url=database_url,
                workdir=workdir,
                progress=progress,
                first=first,
            )
        )
        first += count
    return results


def with_plan(figures: dict[str, Any]) -> dict[str, Any]:
    """`figures` and, when they hold a PostgreSQL journal and the 0 ms worker run, the
    plan at `paper.RECORDS_PER_DAY`."""
    pg = [j for j in figures.get("journal", []) if j["database"] == "postgresql"]
    idle = [w for w in figures.get("worker", []) if w["latency_ms"] == 0]
    if pg and idle:
        intake = figures.get("intake", {}).get("cpu_ms_per_request")
        figures["plan"] = paper.plan(journal=pg[0], worker=idle[0], intake_cpu_ms=intake)
    return figures


def combined(paths: Sequence[Path]) -> dict[str, Any]:
    """Figures saved by several runs, in one: their journals side by side, the rest of a
    later file over an earlier one's; each run's date and command kept under `runs`."""
    figures: dict[str, Any] = {"journal": [], "runs": []}
    for path in paths:
        saved = json.loads(path.read_text())
        figures["runs"].append({k: saved.pop(k, None) for k in ("measured_at", "command")})
        figures["journal"] += saved.pop("journal", [])
        figures.update(saved)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.combine:
        try:
            figures = with_plan(combined(args.combine))
        except (OSError, ValueError, KeyError) as exc:
            print(f"capacity: cannot combine: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(figures, indent=2))
        return 0
    try:
        with tempfile.TemporaryDirectory(prefix="pipeline-capacity-") as workdir:
            figures = with_plan(measure(args, Path(workdir)))
    except (SQLAlchemyError, redis.RedisError, PipelineError, RuntimeError, TimeoutError) as exc:
        print(f"capacity: {type(exc).__name__}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    text = json.dumps(figures, indent=2, default=str)
    if args.save is not None:
        args.save.write_text(text + "\n")
    print(text)
    return 0
