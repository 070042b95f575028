"""`pipeline bench --quick` completes and prints every row of its table; the figures it
saves are all there. Nothing here looks at how fast anything was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.bench.report import ERROR_SEARCH_DRY_RUN, ERROR_SEARCHES, rows
from app.bench.run import SCENARIOS

PIPELINE = str(Path(sys.executable).with_name("pipeline"))
FAIR_SHARES_ROWS = [
    "fair shares: shop B's 20 orders one every 100 ms",
    "fair shares: shop A's 1,000 orders at once",
]
ROWS = [
    "intake: signed, journaled, bounded",
    "intake beside a bare 202-only endpoint",
    "end to end:",
    "end to end, one record",
    "delivery: 200 records to a downstream answering in 20 ms",
    "delivery at the same process count, 20 ms",
    "replay:",
    "intake beside 8 pollers",
    "retention: ",
    "intake during the retention",
    *(f"error search: {what}" for what in (*ERROR_SEARCHES.values(), ERROR_SEARCH_DRY_RUN)),
    "isolation's floor: order p99 beside",
    "isolation: order p99",
    "isolation, the status line's INTAKE_RATE",
    "isolation, the status line on an intake of its own",
    "RSS of the intake",
    "RSS of the worker",
]


# The bench measures the journal it is given (the PostgreSQL pass's), and loads the machine
# on purpose (its loads, one busy loop per CPU): never beside another test that does.
@pytest.mark.journal
@pytest.mark.long
@pytest.mark.loads_machine
@pytest.mark.timeout(480)
def test_quick_bench_completes_and_prints_every_row(harness, tmp_path):
    database = harness.env["PIPELINE_DATABASE_URL"]
    if database.startswith("sqlite"):
        pytest.skip(
            "runs once, in the PostgreSQL pass, against that pass's database (on its own "
            "the bench makes a fresh SQLite journal)"
        )
    saved = tmp_path / "bench.json"
    # Every scenario but fair shares, which has a test of its own (below).
    scenarios = [arg for s in SCENARIOS if s != "fair_shares" for arg in ("--scenario", s)]
    done = quick_bench(harness, saved, *scenarios, "--database-url", database, timeout_s=420)
    table = done.stdout
    for row in ROWS:
        assert row in table, f"{row!r} missing from:\n{table}"
    assert "load generator: " in table
    figures = json.loads(saved.read_text())
    assert len(rows(figures)) == len(ROWS)
    intake = figures["intake"]
    for name in ("ours", "naive", "bare"):
        assert intake[name]["requests"] > 0
        assert intake[name]["non_2xx"] == 0, intake[name]
        assert intake[name]["errors"] == 0, intake[name]
        # The cost beside the rate: the intake process's CPU, the bench's Redis and the
        # PostgreSQL server (its backends are its children).
        cpu = intake[name]["cpu_ms_per_request"]
        assert set(cpu) == {"intake", "redis", "postgres"}, cpu
        assert cpu["intake"] > 0, cpu
    e2e = figures["end_to_end"]
    assert e2e["records"] == 1_000
    for name in ("ours_cpu_ms_per_record", "ours_single_cpu_ms_per_record"):
        assert set(e2e[name]) == {"intake", "worker", "redis", "postgres"}, (name, e2e)
        assert min(e2e[name].values()) > 0, (name, e2e)
    assert set(e2e["celery_noop_cpu_ms_per_record"]) == {"worker", "redis", "postgres"}, e2e
    assert e2e["celery_noop_cpu_ms_per_record"]["worker"] > 0, e2e
    delivery = figures["delivery"]
    assert [run["delay_ms"] for run in delivery["runs"]] == [20]  # a quick run: one delay
    for run in delivery["runs"]:
        records = run["records"]
        assert records == 200
        # Every record done, and the downstream saw each exactly once, ours and plain alike.
        assert run["ours_e2e_done"] == run["ours_drain_done"] == records, run
        for name in ("ours_e2e", "ours_drain", "plain"):
            counts = run["downstream"][name]
            assert counts["requests"] == counts["distinct_keys"] == records, (name, run)
            assert counts["max_in_flight"] >= 1, (name, run)
        for name in ("ours_drain", "plain", "plain_same"):
            cpu = run["downstream"][name]["cpu_ms_per_record"]
            assert set(cpu) == {"worker", "redis", "postgres"}, (name, cpu)
            assert cpu["worker"] > 0, (name, cpu)
            # The kernel counts CPU in 10 ms ticks: our drain of 200 records asks Redis a
            # round trip per chunk of records, a few ms in all, so it may read 0 there.
            assert cpu["redis"] > 0 or name == "ours_drain", (name, cpu)
        # Plain Celery with our process count (one): fewer tasks, each once, one at a time.
        same = run["downstream"]["plain_same"]
        assert run["plain_same_processes"] == 1
        assert same["requests"] == same["distinct_keys"] == run["plain_same_records"] == 100
        assert run["plain_same_max_in_flight"] == same["max_in_flight"] == 1
        assert run["each_once"] is True
        assert run["ours_max_in_flight"] == run["downstream"]["ours_drain"]["max_in_flight"]
        assert run["plain_max_in_flight"] == run["downstream"]["plain"]["max_in_flight"]
        for figure in (
            "ours_e2e_records_per_s",
            "ours_drain_records_per_s",
            "plain_records_per_s",
            "ratio",
            "plain_same_records_per_s",
            "ratio_same",
            "downstream_alone_per_s",
        ):
            assert run[figure] > 0, (figure, run)
        assert run["concurrency"] >= 1
        assert run["batch_size"] >= 1
    assert figures["replay"]["enqueued"] == figures["replay"]["rows"] == 20_000
    replayed = figures["replay"]["cpu_ms_per_record"]
    assert set(replayed) == {"replay", "redis", "postgres"}, replayed
    assert replayed["replay"] > 0, replayed
    polled, retention = figures["polled"], figures["retention"]
    assert polled["polls"] > 0
    assert polled["polls_not_ok"] == 0
    for load in (polled["alone"], polled["polled"], retention["alone"], retention["during"]):
        assert load["requests"] > 0
        assert load["non_2xx"] == 0, load
    assert retention["deleted"] == retention["rows"] == 20_000
    _check_error_search(figures["error_search"], rows=20_000)
    assert figures["isolation"]["alone"]["records"] > 0
    assert figures["isolation"]["busy"]["records"] > 0
    assert figures["isolation"]["busy_loops"] >= 1
    assert figures["isolation"]["flooded"]["records"] > 0
    flood_cpu = figures["isolation"]["flooded_cpu_ms_per_record"]
    assert set(flood_cpu) == {"intake", "order worker", "status worker", "redis", "postgres"}
    assert flood_cpu["intake"] > 0, flood_cpu
    assert figures["isolation"]["paced"]["records"] > 0
    assert figures["isolation"]["paced_intake_rate"] >= 1
    assert figures["machine"]["database"].startswith("postgresql")
    print("\n" + table)


def quick_bench(
    harness, saved: Path, *args: str, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """`pipeline bench --quick ARGS --save SAVED`, run to its end (checked: exit 0), with
    none of the harness's `PIPELINE_` settings."""
    env = {k: v for k, v in harness.env.items() if not k.startswith("PIPELINE_")}
    done = subprocess.run(
        [PIPELINE, "bench", "--quick", *args, "--save", str(saved)],
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.journal
@pytest.mark.timeout(180)
def test_quick_error_search_finds_every_rare_record(harness, tmp_path):
    """`pipeline bench --quick --scenario error_search` on the pass's database: its rows,
    and searches that found what the journal it filled holds."""
    saved = tmp_path / "bench.json"
    database = harness.env["PIPELINE_DATABASE_URL"]
    args = ("--scenario", "error_search", "--database-url", database)
    done = quick_bench(harness, saved, *args, timeout_s=150)
    figures = json.loads(saved.read_text())
    assert len(rows(figures)) == len(ERROR_SEARCHES) + 1
    for row in ROWS:
        if row.startswith("error search: "):
            assert row in done.stdout, f"{row!r} missing from:\n{done.stdout}"
    _check_error_search(figures["error_search"], rows=20_000)


# Floods the intake and a worker for a few seconds, three times over.
@pytest.mark.loads_machine
@pytest.mark.timeout(240)
def test_quick_fair_shares_measures_both_senders(harness, tmp_path):
    """`pipeline bench --quick --scenario fair_shares` on a journal of its own: its two rows,
    and figures for both senders, alone and together."""
    saved = tmp_path / "bench.json"
    done = quick_bench(harness, saved, "--scenario", "fair_shares", timeout_s=210)
    figures = json.loads(saved.read_text())
    assert len(rows(figures)) == 2
    for row in FAIR_SHARES_ROWS:
        assert row in done.stdout, f"{row!r} missing from:\n{done.stdout}"
    _check_fair_shares(figures["fair_shares"])


def _check_fair_shares(shares: dict[str, Any]) -> None:
    """The fair shares scenario's figures in a quick run: every record of both senders
    measured, and each figure a positive number (how fast is not looked at)."""
    assert shares["fair_share"] == 100  # the line's default
    assert (shares["flood_records"], shares["late_records"], shares["rounds"]) == (1_000, 20, 1)
    for name in ("b_alone", "b_beside_a"):
        latencies = shares[name]
        assert latencies["records"] == 20, (name, shares)
        assert 0 < latencies["p50_ms"] <= latencies["p99_ms"] <= latencies["max_ms"], (name, shares)
    for name in ("b_p99_ratio", "a_alone_records_per_s", "a_beside_b_records_per_s"):
        assert shares[name] > 0, (name, shares)
    assert shares["a_change_pct"] > -100, shares  # A's rate beside B is above 0
    for name in ("a_alone_posted_s", "a_beside_b_posted_s"):
        assert len(shares[name]) == 1, (name, shares)
        assert shares[name][0] > 0, (name, shares)
    assert 0 <= shares["a_not_done_when_b_began"][0] <= 1_000, shares


def _check_error_search(search: dict[str, Any], *, rows: int) -> None:
    """The error search's figures: its journal, and what each search found in it."""
    assert search["rows"] == rows
    assert search["with_error"] == rows // 20
    assert search["rare_to_end"]["found"] == 40, search
    for name in ("rare_oldest", "rare_newest", "rare_line_dead"):
        assert 0 < search[name]["found"] <= 40, (name, search)
        assert search[name]["pages"] >= 1, (name, search)
    assert search["common_first_page"]["found"] == search["no_error_filter"]["found"] == 100
    dry = search["dry_run"]
    assert dry["matched"] == dry["acted"] == search["rare_line_dead"]["found"], search
    for name in (*ERROR_SEARCHES, "no_error_filter", "dry_run"):
        assert search[name]["median_ms"] > 0, (name, search)
