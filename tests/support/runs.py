"""Runs of records logged by the `logged_run` handler: which overlapped, how many each."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

from tests.support.handlers import RUNS_LOG_VARIABLE

Run = tuple[float, float | None, int]


def runs_by_record(log: Path) -> dict[str, list[Run]]:
    """Each record's runs, as (start, end or None, pid), in the order they started."""
    started: dict[tuple[str, int], float] = {}
    runs: dict[str, list[Run]] = defaultdict(list)
    lines = log.read_text().splitlines() if log.exists() else []
    for line in lines:
        kind, record_id, at, pid = line.split()
        if kind == "start":
            started[(record_id, int(pid))] = float(at)
        else:
            runs[record_id].append((started.pop((record_id, int(pid))), float(at), int(pid)))
    for (record_id, pid), at in started.items():
        runs[record_id].append((at, None, pid))
    return {record_id: sorted(found) for record_id, found in runs.items()}


def overlapping(
    runs: dict[str, list[Run]], *, killed_at: float | None = None
) -> dict[str, list[Run]]:
    """The records two of whose runs overlapped in time. A run that never ended overlaps
    every later one, unless its process was killed at `killed_at` (time.time())."""
    found = {}
    for record_id, spans in runs.items():
        for (_start, ended, _pid), (next_start, _next_end, _next_pid) in itertools.pairwise(spans):
            end = killed_at if ended is None else ended
            if end is None or next_start < end:
                found[record_id] = spans
    return found


def use_runs_log(harness, tmp_path: Path) -> Path:
    log = tmp_path / "runs.log"
    harness.env[RUNS_LOG_VARIABLE] = str(log)
    harness.monkeypatch.setenv(RUNS_LOG_VARIABLE, str(log))
    harness.configure(lines__order__handler="tests.support.handlers:logged_run")
    return log
