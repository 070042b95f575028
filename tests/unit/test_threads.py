"""`Recent`: computed at most once per lifetime on a clock the test moves, one computation
at a time, the others served the value they can have. `LoopThread`: steps at once (or
first when woken), when woken and when stopped; a step that raises is logged, under its
loop's event, and the loop goes on; a loop that ends itself can be joined and started
again, and a step may make itself the last."""

from __future__ import annotations

import os
import threading
import warnings

import pytest
from structlog.testing import capture_logs

from app.local.processes import wait_until
from app.threads import STOP, LoopThread, Recent


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return self.calls


def test_a_value_is_computed_once_per_lifetime_however_often_it_is_asked_for():
    clock, compute = Clock(), Counting()
    recent: Recent[int] = Recent(lifetime_s=1.0, clock=clock)
    assert [recent.get(compute) for _ in range(100)] == [1] * 100
    clock.now += 0.999
    assert recent.get(compute) == 1
    clock.now += 0.001  # a lifetime after the computation began
    assert [recent.get(compute) for _ in range(100)] == [2] * 100
    assert compute.calls == 2


def test_a_computation_that_fails_changes_nothing_and_the_next_caller_tries_again():
    clock = Clock()
    recent: Recent[str] = Recent(lifetime_s=1.0, clock=clock)
    assert recent.get(lambda: "first") == "first"
    clock.now += 5

    def fail() -> str:
        raise RuntimeError("journal down")

    with pytest.raises(RuntimeError, match="journal down"):
        recent.get(fail)
    assert recent.get(lambda: "second") == "second"


def test_while_one_caller_computes_the_others_get_the_expired_value_at_once():
    clock = Clock()
    recent: Recent[str] = Recent(lifetime_s=1.0, clock=clock)
    assert recent.get(lambda: "old") == "old"
    clock.now += 2
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        assert release.wait(timeout=10)
        return "new"

    got: list[str] = []
    computing = threading.Thread(target=lambda: got.append(recent.get(slow)), daemon=True)
    computing.start()
    try:
        assert started.wait(timeout=10)
        # Not a second computation: this one would fail the test if it ran.
        assert [recent.get(lambda: "again") for _ in range(10)] == ["old"] * 10
    finally:
        release.set()
        computing.join(timeout=10)
    assert got == ["new"]
    assert recent.get(lambda: "again") == "new"


def test_callers_with_no_value_yet_wait_for_the_one_computation():
    recent: Recent[str] = Recent(lifetime_s=1.0, clock=Clock())
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def slow() -> str:
        calls.append(1)
        started.set()
        assert release.wait(timeout=10)
        return "first"

    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(recent.get(slow)), daemon=True)]
    threads[0].start()
    try:
        assert started.wait(timeout=10)
        threads += [
            threading.Thread(target=lambda: got.append(recent.get(slow)), daemon=True)
            for _ in range(4)
        ]
        for thread in threads[1:]:
            thread.start()
    finally:
        release.set()
        for thread in threads:
            thread.join(timeout=10)
    assert got == ["first"] * 5
    assert len(calls) == 1


def test_a_loop_steps_at_once_then_when_woken_and_once_more_when_stopped() -> None:
    steps: list[int] = []
    stepped = threading.Event()

    def step() -> float | None:
        steps.append(len(steps))
        stepped.set()
        return None

    loop = LoopThread(step, name="test-loop", every_s=3600.0, final_step=True)
    loop.start()
    loop.start()  # a second start while it runs starts nothing
    assert stepped.wait(5.0)
    stepped.clear()
    loop.wake()
    assert stepped.wait(5.0)
    assert loop.stop(timeout_s=5.0)
    assert steps == [0, 1, 2]
    assert not loop.alive
    loop.start()  # stopped for good
    assert not loop.alive


@pytest.mark.parametrize(
    ("named", "event"),
    [({}, "loop_step_failed"), ({"failed_event": "renewal_crashed"}, "renewal_crashed")],
)
def test_a_step_that_raises_is_logged_and_the_loop_goes_on(named, event) -> None:
    """Logged under the loop's `failed_event` (`loop_step_failed` unless it names one)."""
    calls: list[int] = []
    second = threading.Event()

    def step() -> float | None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        second.set()
        return None

    loop = LoopThread(step, name="test-raises", every_s=0.01, **named)
    with capture_logs() as logs:
        loop.start()
        assert second.wait(5.0)
        assert loop.stop(timeout_s=5.0)
    assert [entry["event"] for entry in logs if entry.get("loop") == "test-raises"] == [event]


def test_a_step_may_end_its_loop_and_a_later_start_begins_another() -> None:
    runs: list[str] = []

    def step() -> float | None:
        runs.append("step")
        return STOP

    loop = LoopThread(step, name="test-stop", every_s=3600.0)
    loop.start()
    wait_until(lambda: not loop.alive, timeout_s=5.0, what="the loop to end")
    loop.start()
    wait_until(lambda: len(runs) == 2 and not loop.alive, timeout_s=5.0, what="a second run")
    assert runs == ["step", "step"]


def test_stopping_a_loop_never_started_runs_its_final_step_inline() -> None:
    steps: list[str] = []

    def step() -> float | None:
        steps.append(threading.current_thread().name)
        return None

    loop = LoopThread(step, name="test-never-started", every_s=1.0, final_step=True)
    assert loop.stop(timeout_s=1.0)
    assert steps == [threading.current_thread().name]


def test_a_loop_with_no_interval_steps_only_when_woken_and_its_first_step_may_wait() -> None:
    steps: list[int] = []
    stepped = threading.Semaphore(0)

    def step() -> float | None:
        steps.append(len(steps))
        stepped.release()
        return None

    loop = LoopThread(step, name="test-woken", every_s=None, delay_first=True)
    loop.start()
    assert steps == []  # its first step waits for a wake-up (there is no interval)
    loop.wake()
    assert stepped.acquire(timeout=5.0)
    loop.wake()
    assert stepped.acquire(timeout=5.0)
    assert loop.stop(timeout_s=5.0)
    assert steps == [0, 1]


def test_joining_a_loop_waits_for_it_to_end_itself_and_it_may_start_again() -> None:
    steps: list[str] = []
    go_on = threading.Event()

    def step() -> float | None:
        steps.append("step")
        return 0.001 if go_on.is_set() else STOP

    loop = LoopThread(step, name="test-join", every_s=3600.0)
    assert loop.join(timeout_s=1.0)  # never started
    loop.start()
    assert loop.join(timeout_s=5.0)
    assert steps == ["step"]
    assert not loop.stopping
    go_on.set()
    loop.start()
    wait_until(lambda: len(steps) >= 3, timeout_s=5.0, what="steps of the second run")
    assert not loop.join(timeout_s=0.0)  # it goes on: joining does not stop it
    go_on.clear()
    assert loop.join(timeout_s=5.0)


def test_a_step_that_stops_its_loop_is_the_last_but_the_final_one() -> None:
    steps: list[bool] = []
    ended: list[bool] = []

    def step() -> float | None:
        steps.append(loop.stopping)
        if len(steps) == 1:
            ended.append(loop.stop(timeout_s=5.0))  # from its own thread: no wait
        return None

    loop = LoopThread(step, name="test-stops-itself", every_s=3600.0, final_step=True)
    loop.start()
    wait_until(lambda: not loop.alive and len(steps) == 2, timeout_s=5.0, what="the end")
    assert loop.stop(timeout_s=5.0)
    assert (steps, ended) == ([False, True], [False])


def test_a_loop_started_before_a_fork_runs_in_the_child_when_started_there():
    """A forked child has the parent's loop object but not its thread: `start()` there
    begins one (a Celery prefork child reuses what its parent built)."""
    stepped = threading.Event()

    def step() -> float | None:
        stepped.set()
        return None

    loop = LoopThread(step, name="test-fork", every_s=3600.0)
    loop.start()
    assert stepped.wait(5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork beside threads, on purpose
        pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never return into pytest
        code = 1
        try:
            stepped.clear()
            loop.start()
            code = 0 if stepped.wait(5.0) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)  # the child's own wait is bounded (5 s)
    assert os.waitstatus_to_exitcode(status) == 0
    assert loop.stop(timeout_s=5.0)


def test_a_start_that_could_not_make_its_thread_leaves_the_next_start_free(monkeypatch):
    stepped = threading.Event()

    def step() -> float | None:
        stepped.set()
        return None

    def no_thread_left(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    loop = LoopThread(step, name="test-no-thread", every_s=3600.0)
    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", no_thread_left)
        with pytest.raises(RuntimeError):
            loop.start()
    loop.start()
    assert stepped.wait(5.0)
    assert loop.stop(timeout_s=5.0)
