"""Replay of 100,000 journal rows, dry run and real, in flat memory, skipping the records
downstream already has. Asserts memory growth, never time; prints the rate."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from sqlalchemy import func, insert, select

from app.clock import utcnow
from app.ids import new_id
from app.journal.models import RecordStatus, orders, records
from tests.support.messages import queued_ids
from tests.support.processes import REPO

# Seeding and replaying 100,000 rows twice takes about a minute on this kind of machine.
# Each scenario loads the machine: under pytest -n N they run one after another.
pytestmark = [pytest.mark.timeout(420), pytest.mark.loads_machine]

ROWS = 100_000
BASELINE_ROWS = 1_000
# Peak RSS of the replay process may grow by at most this between 1,000 and 100,000 rows.
MAX_GROWTH_KB = 64 * 1024


def seed(rt, *, line: str, count: int, synced_every: int | None = None) -> None:
    """`count` dead records of `line`; every `synced_every`-th one already downstream."""
    start = utcnow() - timedelta(hours=1)
    with rt.engine.begin() as conn:
        for chunk in range(0, count, 5000):
            rows, synced = [], []
            for n in range(chunk, min(chunk + 5000, count)):
                at = start + timedelta(milliseconds=n)
                rid, bn = new_id(at), f"{line[0].upper()}-{n}"
                rows.append(
                    {
                        "id": rid,
                        "line": line,
                        "business_no": bn,
                        "source": "intake",
                        "dedup_key": f"seed:{rid}",
                        "body_sha256": "0" * 64,
                        "payload": {"business_no": bn},
                        "status": RecordStatus.DEAD.value,
                        "attempts": 8,
                        "created_at": at,
                        "updated_at": at,
                        "finished_at": at,
                        "last_error": "seeded",
                        "task_id": rid,
                    }
                )
                if synced_every and n % synced_every == 0:
                    synced.append(
                        {"business_no": bn, "record_id": rid, "payload": {}, "updated_at": at}
                    )
            conn.execute(insert(records), rows)
            if synced:
                conn.execute(insert(orders), synced)


def run_replay(harness, *args: str) -> tuple[int, str, float]:
    """Run `pipeline replay ARGS`; returns its peak RSS (KiB), its output, its seconds."""
    log = harness.tmp_path / f"replay-{time.monotonic_ns()}.log"
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "replay", *args],
            env=harness.env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _pid, status, usage = os.wait4(process.pid, 0)
    finally:
        if process.poll() is None:
            process.kill()
    process.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.monotonic() - started
    output = log.read_text()
    assert process.returncode == 0, output
    return usage.ru_maxrss, output, elapsed


def summary(output: str) -> list[int]:
    """The numbers of the summary table's row."""
    rows = [line for line in output.splitlines() if re.match(r"^│\s*\d", line)]
    return [int(n) for n in re.findall(r"\d+", rows[-1])]


def test_replay_of_100000_rows_runs_in_flat_memory_and_skips_the_synced(harness):
    harness.configure(lines__order__max_queue_length="200000")
    rt = harness.runtime()
    seed(rt, line="refund", count=BASELINE_ROWS)
    seed(rt, line="order", count=ROWS, synced_every=10)

    small_rss, _, _ = run_replay(harness, "--line", "refund", "--dry-run")
    dry_rss, dry_out, dry_s = run_replay(harness, "--line", "order", "--dry-run")
    assert summary(dry_out) == [ROWS, ROWS * 9 // 10, 0, 0, ROWS // 10, 0]
    with rt.engine.connect() as conn:
        statuses = set(conn.execute(select(records.c.status).distinct()).scalars())
    assert statuses == {"dead"}  # a dry run changes nothing
    assert rt.redis.llen("order") == 0

    real_rss, real_out, real_s = run_replay(harness, "--line", "order")
    assert summary(real_out) == [ROWS, ROWS * 9 // 10, 0, 0, ROWS // 10, 0]
    assert len(queued_ids(rt.redis, "order")) == ROWS * 9 // 10
    with rt.engine.connect() as conn:
        query = (
            select(records.c.status, func.count())
            .where(records.c.line == "order")
            .group_by(records.c.status)
        )
        counts = {row[0]: row[1] for row in conn.execute(query)}
    assert counts == {"enqueued": ROWS * 9 // 10, "done": ROWS // 10}

    assert dry_rss - small_rss < MAX_GROWTH_KB, (small_rss, dry_rss)
    assert real_rss - small_rss < MAX_GROWTH_KB, (small_rss, real_rss)
    print(
        f"\nreplay of {ROWS} rows: dry run {ROWS / dry_s:.0f} records/s, "
        f"real {ROWS / real_s:.0f} records/s; peak RSS {small_rss // 1024} MiB for "
        f"{BASELINE_ROWS} rows, {dry_rss // 1024} / {real_rss // 1024} MiB for {ROWS}"
    )
