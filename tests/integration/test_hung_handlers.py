"""A line's handler that hangs past the line's `delivery_timeout_s` keeps its thread (a
thread cannot be stopped). Hung calls must cost only their own records' attempts: a record
whose handler call never started has not been attempted, so no attempt of it may be
failed for it, and the good records posted behind the hung ones end `done`, their
handler really called."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from app.clock import utcnow
from app.journal.models import Record
from tests.support.downstream import post_records
from tests.support.hanging_handler import (
    ENTRIES_VARIABLE,
    HANG,
    HANG_PREFIX,
    RELEASE_VARIABLE,
    entries,
    entry_count,
)
from tests.support.harness import FINAL, Harness
from tests.support.processes import wait_for
from tests.support.recorder import Recorder

# What it checks is the engine's and Redis's, not the journal's database: the SQLite pass only.
pytestmark = pytest.mark.journal_independent

LINE = "hung"
# More hung records than a 2-core machine's default executor has threads (min(32, cpus
# + 4) = 6): any pool of that size is taken whole by them.
HUNG_RECORDS = 8
GOOD_RECORDS = 3
MAX_ATTEMPTS = 3
# How long the hung calls are held before the test releases them: long enough for every
# record's attempts to be spent while they are held (one slot, a second per attempt:
# (8 + 3) records x 3 attempts), unless the product waits for a free thread instead.
HOLD_S = 45.0


def test_hung_handlers_never_fail_good_records_whose_handler_never_ran(
    harness: Harness, tmp_path: Path
) -> None:
    entries_log = tmp_path / "handler-entries.log"
    release = tmp_path / "handler-release"
    for name, value in ((ENTRIES_VARIABLE, entries_log), (RELEASE_VARIABLE, release)):
        harness.env[name] = str(value)
        harness.monkeypatch.setenv(name, str(value))
    harness.configure(
        # A line of its own, delivered by the test's handler.
        **{
            f"lines__{LINE}__handler": "tests.support.hanging_handler:hang_or_pass",
            f"lines__{LINE}__delivery_timeout_s": "1",
            f"lines__{LINE}__max_attempts": str(MAX_ATTEMPTS),
            f"lines__{LINE}__backoff_initial_s": "0.05",
            f"lines__{LINE}__backoff_max_s": "0.2",
        },
        sweep_interval_seconds="0.5",  # the sweeper re-enqueues retries when due
    )
    try:
        client = harness.start_intake()
        # A handler line's default pool (`pipeline worker`): prefork; one pool process.
        harness.start_worker(LINE, pool="prefork", concurrency=1)
        harness.start_beat()
        hung = post_records(client, LINE, HUNG_RECORDS, HANG_PREFIX)
        good = post_records(client, LINE, GOOD_RECORDS, "GOOD")

        # The hung calls are held until the good records are final, or for HOLD_S.
        release_at = time.monotonic() + HOLD_S
        final = {status.value for status in FINAL}

        def good_final_or_hold_over() -> bool:
            statuses = harness.statuses()
            done_with = all(statuses.get(i) in final for i in good)
            return done_with or time.monotonic() >= release_at

        wait_for(good_final_or_hold_over, timeout_s=HOLD_S + 30, what="the hold to end")
        hung_entries_held = entry_count(entries_log, HANG)
    finally:
        release.touch()

    records = harness.wait_until_final(hung | good, timeout_s=60)
    entered = entries(entries_log)
    attempts: dict[str, list[tuple[int, str]]] = {}
    for record_id, attempt, outcome in harness.rows(
        "SELECT record_id, attempt, outcome FROM record_attempts ORDER BY id"
    ):
        attempts.setdefault(record_id, []).append((attempt, outcome))

    def history(ids: set[str]) -> dict[str, object]:
        return {
            records[i].business_no: {
                "status": records[i].status.value,
                "attempts": attempts.get(i, []),
                "handler_entered_on_attempts": sorted(entered.get(i, ())),
            }
            for i in sorted(ids, key=lambda i: records[i].business_no)
        }

    # The good records were delivered, by a real call of their handler.
    assert {records[i].status.value for i in good} == {"done"}, (
        f"hung handler calls entered while held: {hung_entries_held}; good records: {history(good)}"
    )
    assert all(entered.get(i) for i in good), history(good)
    # Every recorded attempt, of any record, ran its handler: no attempt was spent (and no
    # record failed or killed) for a handler call that never started.
    never_ran = {
        records[record_id].business_no: [
            (n, outcome) for n, outcome in rows if n not in entered.get(record_id, set())
        ]
        for record_id, rows in attempts.items()
        if record_id in records
    }
    never_ran = {business_no: rows for business_no, rows in never_ran.items() if rows}
    killed = [records[i].business_no for i in hung if records[i].status.value == "dead"]
    assert not [business_no for business_no in killed if business_no in never_ran], (
        f"hung records dead for attempts that never ran: {history(hung)}"
    )
    assert never_ran == {}, f"attempts recorded whose handler call never started: {never_ran}"


def test_a_line_whose_handler_threads_are_all_held_waits_says_so_and_spends_nothing(
    harness: Harness, tmp_path: Path
) -> None:
    """Two handler threads, both held by calls that overran: the next record does not
    start (no attempt spent, it waits as `failed`), a hung record is not called again
    while its last call runs, `HANDLER_STUCK` is raised and the health page names the
    line; once the calls return, both run."""
    entries_log = tmp_path / "handler-entries.log"
    release = tmp_path / "handler-release"
    for name, value in ((ENTRIES_VARIABLE, entries_log), (RELEASE_VARIABLE, release)):
        harness.env[name] = str(value)
        harness.monkeypatch.setenv(name, str(value))
    recorder = Recorder().start()
    harness.configure(
        **{
            f"lines__{LINE}__handler": "tests.support.hanging_handler:hang_or_pass",
            f"lines__{LINE}__delivery_timeout_s": "1",
            f"lines__{LINE}__handler_threads": "2",
            f"lines__{LINE}__backoff_initial_s": "0.05",
            f"lines__{LINE}__backoff_max_s": "0.2",
        },
        alert_webhooks=json.dumps([{"kind": "generic", "url": f"{recorder.url}/hook"}]),
    )
    rt = harness.runtime()
    line = rt.lines.get(LINE)
    try:
        client = harness.start_intake()
        hung = sorted(post_records(client, LINE, 2, HANG_PREFIX))
        (good,) = post_records(client, LINE, 1, "GOOD")
        overran = rt.attempts.run(hung, line=line)  # each overruns its second
        assert [result.outcome.value if result.outcome else None for result in overran] == [
            "timeout",
            "timeout",
        ]
        (waited,) = rt.attempts.run([good], line=line)
        assert waited.record is None  # not started
        record = _record(harness, good)
        assert (record.status.value, record.attempts) == ("failed", 0)
        assert "held by a call that overran" in (record.last_error or "")
        (again,) = rt.attempts.run([hung[0]], line=line)  # its call has not returned
        assert again.record is None
        assert _record(harness, hung[0]).attempts == 1
        assert entry_count(entries_log, HANG) == 2  # no call but the first two
        wait_for(
            lambda: any(r.body.get("event") == "HANDLER_STUCK" for r in _hooks(recorder)),
            timeout_s=10,
            what="HANDLER_STUCK",
        )
        health = client.get("/v1/health").json()
        assert ("handler_stuck", LINE) in {(r["code"], r["line"]) for r in health["reasons"]}

        release.touch()
        # Each is attempted once its retry is due (in a second or two) and swept.
        left = {good, *hung}

        def delivered() -> bool:
            rt.sweeper.sweep(now=utcnow())
            for result in rt.attempts.run(sorted(left), line=line):
                if result.status is not None and result.status.value == "done":
                    left.discard(result.record_id)
            return not left

        wait_for(delivered, timeout_s=20, what="the three records delivered")
        assert {_record(harness, i).attempts for i in hung} == {2}
        assert _record(harness, good).attempts == 1
    finally:
        release.touch()
        recorder.stop()


def _record(harness: Harness, record_id: str) -> Record:
    return next(record for record in harness.records() if record.id == record_id)


def _hooks(recorder: Recorder) -> list[Any]:
    return [received for received in recorder.snapshot() if received.path == "/hook"]
