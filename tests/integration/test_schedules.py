"""Schedules on the real journal and Redis: misfire after a restart, and changes through the
CLI picked up by a running beat."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from app.clock import utcnow
from app.journal.models import RecordStatus
from app.journal.models import schedules as schedules_table
from app.schedules.cron import Misfire
from app.schedules.store import add, set_enabled
from tests.support.processes import REPO, wait_for

START = datetime(2026, 5, 1, 10, 0, 0, tzinfo=UTC)


def scheduled(harness, name: str) -> list[str]:
    return sorted(
        r.dedup_key for r in harness.records() if r.dedup_key.startswith(f"schedule:{name}:")
    )


@pytest.mark.journal
@pytest.mark.parametrize(("policy", "expected"), [("fire_once", 1), ("skip", 0), ("fire_all", 3)])
def test_beat_stopped_across_three_due_times_then_restarted(harness, policy, expected):
    rt = harness.runtime()
    with rt.engine.begin() as conn:
        add(
            conn,
            name="nightly",
            cron="* * * * *",
            timezone="UTC",
            line="order",
            payload={},
            misfire=Misfire(policy),
            catchup_window_s=3600,
            now=START,
        )
    on_time = START + timedelta(minutes=1, seconds=1)
    assert rt.firer.fire_due(now=on_time, active_since=START) == 1
    # Beat is down from 10:01:01 to 10:04:30: 10:02, 10:03 and 10:04 are missed.
    restart = START + timedelta(minutes=4, seconds=30)
    assert rt.firer.fire_due(now=restart, active_since=restart) == expected
    assert rt.firer.fire_due(now=restart, active_since=restart) == 0  # restarted again
    assert rt.firer.fire_due(now=restart + timedelta(seconds=10), active_since=restart) == 0
    assert len(scheduled(harness, "nightly")) == 1 + expected


@pytest.mark.journal
def test_the_same_fire_from_two_beats_is_stored_once(harness):
    rt = harness.runtime()
    with rt.engine.begin() as conn:
        add(
            conn,
            name="twice",
            cron="* * * * *",
            timezone="UTC",
            line="order",
            payload={},
            misfire=Misfire.FIRE_ALL,
            catchup_window_s=3600,
            now=START,
        )
    now = START + timedelta(minutes=1, seconds=1)
    assert rt.firer.fire_due(now=now, active_since=START) == 1
    with rt.engine.begin() as conn:  # another beat that had not seen the fire yet
        conn.execute(update(schedules_table).values(last_fire_at=None))
    assert rt.firer.fire_due(now=now, active_since=START) == 0
    assert len(scheduled(harness, "twice")) == 1


@pytest.mark.parametrize("overflow", ["reject", "caller_runs"])
def test_a_fire_into_a_full_line_is_deferred_whatever_its_policy_and_runs_once_there_is_room(
    harness, overflow
):
    """Nobody sends a fire again, and beat runs no handler: a fire that finds its line full
    waits in the journal, as `deferred`, for the sweeper, under any overflow policy."""
    harness.configure(lines__order__overflow=overflow, lines__order__max_queue_length="1")
    client = harness.start_intake()
    response = client.post("/v1/order", json={"business_no": "FILL-1"})
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "enqueued"  # the line is now full: 1 of 1
    filler = response.json()["id"]
    rt = harness.runtime()
    with rt.engine.begin() as conn:
        add(
            conn,
            name="into-full",
            cron="* * * * *",
            timezone="UTC",
            line="order",
            payload={},
            misfire=Misfire.FIRE_ONCE,
            catchup_window_s=3600,
            now=START,
        )
    assert rt.firer.fire_due(now=START + timedelta(minutes=1, seconds=1), active_since=START) == 1
    (fire,) = [r for r in harness.records() if r.source.value == "schedule"]
    assert fire.status is RecordStatus.DEFERRED
    with rt.engine.begin() as conn:  # the beat started below is to sweep, not to fire more
        set_enabled(conn, "into-full", enabled=False, now=utcnow())

    harness.start_worker("order")
    harness.start_beat()
    final = harness.wait_until_final({filler, fire.id})
    assert {r.id: r.status for r in final.values()} == {
        filler: RecordStatus.DONE,
        fire.id: RecordStatus.DONE,
    }


def cli(harness, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "schedules", *args],
        env=harness.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_schedules_added_changed_and_disabled_by_the_cli_take_effect_within_10_s(harness):
    harness.start_worker("order")
    harness.start_beat()
    cli(
        harness,
        "add",
        "pulse",
        "--cron",
        "* * * * * */2",
        "--line",
        "order",
        "--payload",
        '{"kind": "pulse"}',
    )
    started = time.monotonic()
    wait_for(lambda: scheduled(harness, "pulse"), timeout_s=10, what="the first fire")
    assert time.monotonic() - started < 10

    cli(harness, "add", "pulse", "--cron", "* * * * * */2", "--line", "refund", "--replace")
    changed_at = datetime.now(UTC)
    wait_for(
        lambda: any(r.line == "refund" for r in harness.records() if r.source.value == "schedule"),
        timeout_s=10,
        what="a fire on the changed line",
    )
    cli(harness, "disable", "pulse")
    disabled_at = datetime.now(UTC)
    # Proves an absence, so time must pass: two due times of the 2 s schedule, at least
    # one of them past the 1.5 s a fire already under way may take.
    time.sleep(4)
    late = [
        r
        for r in harness.records()
        if r.source.value == "schedule" and r.created_at > disabled_at + timedelta(seconds=1.5)
    ]
    assert late == []
    fired = [r for r in harness.records() if r.source.value == "schedule"]
    assert all(r.line == "order" for r in fired if r.created_at < changed_at - timedelta(seconds=1))
    assert all(r.payload["business_no"].startswith("pulse:") for r in fired)
    assert "pulse" in cli(harness, "list")
