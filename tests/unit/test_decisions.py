"""The pipeline's decisions, as pure functions over values: what a full queue does to a
record, which alerts a line's state calls for, when a maintenance job is due."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from app.admission.accept import decide_overflow
from app.config.line_settings import Overflow
from app.journal.models import RecordStatus
from app.journal.transitions import Event as Transition
from app.observe.line_view import LineStatus
from app.observe.monitor import check_line
from app.telemetry.events import Event
from beat.maintenance import Job, Maintenance, MaintenanceThread, MaintenanceThreads, due
from beat.scheduler import until_next_tick


@pytest.mark.parametrize(
    ("policy", "status", "transition"),
    [
        (Overflow.DEFER, RecordStatus.DEFERRED, Transition.DEFERRED),
        (Overflow.REJECT, RecordStatus.REJECTED, Transition.REJECTED),
        (Overflow.CALLER_RUNS, RecordStatus.RECEIVED, None),
    ],
)
def test_a_full_queue_defers_rejects_or_leaves_the_record_to_its_caller(policy, status, transition):
    decision = decide_overflow(policy)
    assert (decision.status, decision.transition) == (status, transition)
    assert decision.caller_runs is (policy is Overflow.CALLER_RUNS)


def row(**overrides) -> LineStatus:
    values = {
        "line": "order",
        "queue_depth": 0,
        "max_queue_length": 10,
        "overflow": "defer",
        "live_workers": 1,
        "counts": {},
        "oldest_unfinished_age_s": None,
    }
    return LineStatus(**(values | overrides))


def test_a_healthy_line_calls_for_no_alert():
    assert check_line(row(counts={"done": 5}), backlog_after_s=60) == []


def test_waiting_records_and_no_live_worker_call_for_no_consumer():
    found = check_line(
        row(counts={"enqueued": 3, "failed": 9}, queue_depth=3, live_workers=0),
        backlog_after_s=60,
    )
    assert [f.event for f in found] == [Event.NO_CONSUMER]
    assert found[0].details == {"waiting": 3, "queue_depth": 3}


def test_only_failed_records_waiting_for_their_retry_call_for_nothing():
    assert check_line(row(counts={"failed": 2}, live_workers=0), backlog_after_s=60) == []


def test_unknown_liveness_is_not_called_dead():
    assert check_line(row(counts={"received": 1}, live_workers=None), backlog_after_s=60) == []


def test_an_old_unfinished_record_calls_for_backlog_past_the_threshold_only():
    assert check_line(row(oldest_unfinished_age_s=60.0), backlog_after_s=60) == []
    found = check_line(row(oldest_unfinished_age_s=61.04), backlog_after_s=60)
    assert [(f.event, f.details) for f in found] == [
        (Event.BACKLOG, {"oldest_unfinished_age_s": 61.0, "threshold_s": 60})
    ]


def test_a_job_is_due_one_interval_after_its_last_run():
    assert not due(last_run_s=10.0, interval_s=5.0, now_s=14.9)
    assert due(last_run_s=10.0, interval_s=5.0, now_s=15.0)


def test_maintenance_runs_each_job_when_due_and_a_failing_job_stops_no_other():
    clock_s = [0.0]
    runs: list[str] = []

    def broken() -> None:
        runs.append("broken")
        raise RuntimeError("a job's own failure")

    maintenance = Maintenance(
        [
            Job(name="broken", interval_s=2, run=broken),
            Job(name="sweep", interval_s=1, run=lambda: runs.append("sweep")),
        ],
        clock=lambda: clock_s[0],
        start_s=0.0,
    )
    assert maintenance.run_due() == 1.0  # nothing is due at the start
    clock_s[0] = 1.0
    assert maintenance.run_due() == 1.0
    clock_s[0] = 2.0
    maintenance.run_due()
    assert runs == ["sweep", "broken", "sweep"]


def test_a_job_whose_turn_comes_after_the_lock_was_lost_does_not_run():
    runs: list[str] = []
    held = [True]

    def first() -> None:
        runs.append("first")
        held[0] = False  # the lock is lost while this job runs

    maintenance = Maintenance(
        [Job(name="first", interval_s=1, run=first), Job(name="second", interval_s=1, run=list)],
        clock=lambda: 5.0,
        start_s=0.0,
    )
    maintenance.run_due(go_on=lambda: held[0])
    assert runs == ["first"]


def test_maintenance_ends_after_the_job_under_way_when_the_lock_is_lost_and_never_overlaps():
    """A job holds until the test lets it go; meanwhile the lock is lost and taken again,
    and the beat asks for maintenance on every tick: still one run at a time. Once the
    lock is lost the thread ends after the job; taken again, the jobs go on where they
    were."""
    held, release, stopping = [True], threading.Event(), threading.Event()
    running, overlaps, started = [0], [0], threading.Event()

    def long_job() -> None:
        running[0] += 1
        overlaps[0] += running[0] > 1
        started.set()
        release.wait(timeout=10)
        running[0] -= 1

    clock_s = [0.0]
    thread = MaintenanceThread(
        [Job(name="retention", interval_s=1, run=long_job)],
        active=lambda: held[0],
        stopping=stopping,
        clock=lambda: clock_s[0],
    )
    thread.ensure_running()
    clock_s[0] = 1.0
    assert started.wait(timeout=10)
    held[0] = False
    thread.ensure_running()
    held[0] = True
    thread.ensure_running()
    assert [t.name for t in threading.enumerate()].count("beat-maintenance") == 1
    held[0] = False
    release.set()
    assert thread.join(timeout_s=10)
    assert (overlaps, running) == ([0], [0])
    # Taken again a second later: the job, due by the timing kept across threads, runs.
    started.clear()
    held[0], clock_s[0] = True, 2.0
    thread.ensure_running()
    assert started.wait(timeout=10)
    stopping.set()
    assert thread.join(timeout_s=10)


@pytest.mark.parametrize(
    ("microsecond", "expected_s"), [(0, 1.01), (990_000, 0.02), (500_000, 0.51)]
)
def test_beat_ticks_just_after_each_whole_second(microsecond, expected_s):
    now = datetime(2026, 5, 1, 10, 0, 0, microsecond, tzinfo=UTC)
    assert until_next_tick(now) == pytest.approx(expected_s)


def test_a_long_job_on_its_own_thread_holds_up_none_of_the_others():
    stopping, release, swept = threading.Event(), threading.Event(), threading.Event()
    sweeps: list[int] = []

    def sweep() -> None:
        sweeps.append(1)
        if len(sweeps) >= 3:
            swept.set()

    threads = MaintenanceThreads(
        [
            Job(name="sweep", interval_s=0.01, run=sweep),
            Job(name="retention", interval_s=0.01, run=lambda: release.wait(10), thread="purge"),
        ],
        active=lambda: True,
        stopping=stopping,
    )
    threads.ensure_running()
    try:
        # Three sweeps while the purge holds its own thread.
        assert swept.wait(timeout=10)
        assert not release.is_set()
        names = [t.name for t in threading.enumerate()]
        assert (names.count("beat-maintenance"), names.count("beat-purge")) == (1, 1)
    finally:
        stopping.set()
        release.set()
        assert threads.join(timeout_s=10)
