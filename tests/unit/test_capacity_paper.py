"""The arithmetic of docs/capacity.md: Little's law, disk per retention period, the bytes
of a table with its indexes on either database, and the plan built from them."""

from __future__ import annotations

import pytest

from tests.capacity import paper


def test_pool_processes_follow_littles_law_rounded_up():
    # 350 deliveries/s, each 10 ms of the worker's own plus 50 ms of the downstream's:
    # 350 x 0.06 = 21 in flight.
    assert paper.pool_processes(rate_per_s=350, overhead_s=0.010, latency_s=0.050) == 21
    assert paper.pool_processes(rate_per_s=350, overhead_s=0.011, latency_s=0.050) == 22
    assert paper.pool_processes(rate_per_s=10, overhead_s=0.01, latency_s=0) == 1


def test_attempt_time_is_the_pool_over_the_rate():
    assert paper.attempt_time_s(records_per_s=80, concurrency=4) == pytest.approx(0.05)


def test_journal_disk_counts_each_days_records_and_their_attempts():
    disk = paper.journal_disk(
        days=30,
        records_per_day=10_000_000,
        record_bytes=1000,
        attempt_bytes=200,
        attempts_per_record=1.5,
    )
    assert disk == 30 * 10_000_000 * 1300


POSTGRES = {
    "records": {"kind": "table", "table": "records", "bytes": 800, "total_bytes": 1500},
    "pk_records": {"kind": "index", "table": "records", "bytes": 300},
    "record_attempts": {
        "kind": "table",
        "table": "record_attempts",
        "bytes": 150,
        "total_bytes": 300,
    },
}
SQLITE = {
    "records": {"kind": "table", "table": "records", "bytes": 800},
    "sqlite_autoindex_records_1": {"kind": "index", "table": "records", "bytes": 300},
    "ix_records_created_at": {"kind": "index", "table": "records", "bytes": 100},
    "record_attempts": {"kind": "table", "table": "record_attempts", "bytes": 150},
}


def test_a_tables_bytes_include_its_indexes_once_on_either_database():
    # PostgreSQL's total already holds the indexes; SQLite's are added up.
    assert paper.table_bytes(POSTGRES, "records") == 1500
    assert paper.table_bytes(SQLITE, "records") == 1200
    assert paper.table_bytes(SQLITE, "record_attempts") == 150


def test_plan_carries_the_measured_figures_to_ten_million_a_day():
    journal = {"database": "postgresql", "records": 10, "attempts": 11}
    journal["lived"] = journal["compact"] = POSTGRES
    # 1 pool process, 0 ms downstream, 100 records/s: each delivery costs the worker 10 ms.
    worker = {
        "latency_ms": 0,
        "concurrency": 1,
        "records_per_s": 100.0,
        "worker_cpu_ms_per_record": 5.0,
    }
    plan = paper.plan(journal=journal, worker=worker, intake_cpu_ms=2.0)
    assert plan["mean_per_s"] == pytest.approx(115.74, abs=0.01)
    assert plan["peak_per_s"] == pytest.approx(347.22, abs=0.01)
    assert plan["attempt_rows_per_day"] == pytest.approx(11_000_000)
    assert plan["bytes_compact"] == {"record": 150.0, "attempt": pytest.approx(300 / 11)}
    assert plan["overhead_s"] == pytest.approx(0.010)
    # 347.2/s x (0.010 + latency)
    assert plan["pool_processes_at_peak"] == {0: 4, 50: 21, 200: 73}
    assert plan["worker_cores_at_peak"] == pytest.approx(347.22 * 0.005, abs=0.001)
    assert plan["intake_cores_at_peak"] == pytest.approx(347.22 * 0.002, abs=0.001)
    per_record = 150.0 + 1.1 * 300 / 11
    assert plan["disk"][30]["compact"] == pytest.approx(30 * 10_000_000 * per_record)
    assert set(plan["disk"]) == {7, 30, 90}
