"""Capacity on paper: measured figures carried to a daily volume. Pure arithmetic, no I/O.

Little's law: the deliveries in flight on a line are its rate times the time each one
takes, L = λ·W. A worker's pool process holds one delivery at a time (one record to a
message on an HTTP sink, prefetch one), so a line needs L pool processes, spread over as
many worker processes and hosts as its CPU needs."""

from __future__ import annotations

import math
from typing import Any

DAY_S = 86_400
# What the doc plans for: the daily volume, the peak hour's rate against the day's mean,
# the retention periods, the downstream latencies.
RECORDS_PER_DAY = 10_000_000
PEAK_FACTOR = 3.0
RETENTION_DAYS = (7, 30, 90)
LATENCIES_MS = (0, 50, 200)


def per_second(records_per_day: float) -> float:
    """The mean rate of a daily volume."""
    return records_per_day / DAY_S


def table_bytes(sizes: dict[str, dict[str, Any]], table: str) -> int:
    """A table's bytes with its indexes (and, on PostgreSQL, its TOAST), from
    `tests.capacity.journal.relation_sizes`."""
    entry = sizes[table]
    if "total_bytes" in entry:
        return int(entry["total_bytes"])
    return sum(int(e["bytes"]) for e in sizes.values() if e["table"] == table)


def bytes_per(journal: dict[str, Any], stage: str) -> dict[str, float]:
    """Bytes on disk per record (its row and its indexes) and per attempt (the same), from
    `tests.capacity.journal.measure_journal`'s figures at `stage` (`lived` or `compact`)."""
    sizes = journal[stage]
    return {
        "record": table_bytes(sizes, "records") / journal["records"],
        "attempt": table_bytes(sizes, "record_attempts") / journal["attempts"],
    }


def journal_disk(
    *,
    days: float,
    records_per_day: float,
    record_bytes: float,
    attempt_bytes: float,
    attempts_per_record: float,
) -> float:
    """Bytes the journal holds with `days` of records kept (retention deletes a `done`
    record with its attempts after that)."""
    per_record = record_bytes + attempts_per_record * attempt_bytes
    return days * records_per_day * per_record


def attempt_time_s(*, records_per_s: float, concurrency: int) -> float:
    """W of one delivery, from a worker's measured rate with `concurrency` pool processes
    kept busy: each process finishes one every `concurrency / rate` seconds."""
    return concurrency / records_per_s


def pool_processes(*, rate_per_s: float, overhead_s: float, latency_s: float) -> int:
    """L = λ·W: pool processes a line needs at `rate_per_s` when a delivery takes the
    worker's `overhead_s` plus the downstream's `latency_s` (rounded up)."""
    return math.ceil(rate_per_s * (overhead_s + latency_s))


def cores(*, rate_per_s: float, cpu_s_per_unit: float) -> float:
    """CPU cores a rate keeps busy at `cpu_s_per_unit` CPU seconds each."""
    return rate_per_s * cpu_s_per_unit


def plan(
    *, journal: dict[str, Any], worker: dict[str, Any], intake_cpu_ms: float | None
) -> dict[str, Any]:
    """The paper's figures at `RECORDS_PER_DAY`: rows, disk per retention period, pool
    processes per latency, cores. `journal`: a PostgreSQL `measure_journal` result;
    `worker`: the measured run at 0 ms downstream latency (its `W` is the overhead)."""
    mean = per_second(RECORDS_PER_DAY)
    peak = mean * PEAK_FACTOR
    attempts_per_record = journal["attempts"] / journal["records"]
    lived, compact = bytes_per(journal, "lived"), bytes_per(journal, "compact")
    overhead_s = (
        attempt_time_s(records_per_s=worker["records_per_s"], concurrency=worker["concurrency"])
        - worker["latency_ms"] / 1000
    )
    disk = {
        days: {
            stage: journal_disk(
                days=days,
                records_per_day=RECORDS_PER_DAY,
                record_bytes=sizes["record"],
                attempt_bytes=sizes["attempt"],
                attempts_per_record=attempts_per_record,
            )
            for stage, sizes in (("lived", lived), ("compact", compact))
        }
        for days in RETENTION_DAYS
    }
    worker_cpu_s = worker["worker_cpu_ms_per_record"] / 1000
    return {
        "records_per_day": RECORDS_PER_DAY,
        "mean_per_s": mean,
        "peak_per_s": peak,
        "attempt_rows_per_day": RECORDS_PER_DAY * attempts_per_record,
        "bytes_lived": lived,
        "bytes_compact": compact,
        "disk": disk,
        "overhead_s": overhead_s,
        "pool_processes_at_peak": {
            ms: pool_processes(rate_per_s=peak, overhead_s=overhead_s, latency_s=ms / 1000)
            for ms in LATENCIES_MS
        },
        "worker_cores_at_peak": cores(rate_per_s=peak, cpu_s_per_unit=worker_cpu_s),
        "intake_cores_at_peak": (
            None
            if intake_cpu_ms is None
            else cores(rate_per_s=peak, cpu_s_per_unit=intake_cpu_ms / 1000)
        ),
    }
