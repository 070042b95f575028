"""The maintenance jobs of the active beat: each runs every `interval_s`, in the beat's own
process and under its lock (the sweeper, the lost-message check, the monitor, retention).

They are not Celery beat entries: nothing is sent to a worker, so they keep working when
every queue is full or no worker is alive. They run on threads of their own
(`MaintenanceThreads`: the jobs of one thread one at a time), so a long run delays neither
the lock's renewal nor the fires; retention has a thread to itself, so a big purge does
not hold up the sweeper either."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.errors import PipelineError
from app.telemetry.logs import get_logger
from app.threads import STOP, LoopThread

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class Job:
    """One maintenance job: its name (in logs), how often it runs, what it runs, and the
    thread it runs on (the jobs of one thread run one after another)."""

    name: str
    interval_s: float
    run: Callable[[], object]
    thread: str = "maintenance"


def due(*, last_run_s: float, interval_s: float, now_s: float) -> bool:
    """Whether a job last run at `last_run_s` is due at `now_s` (one clock, seconds)."""
    return now_s - last_run_s >= interval_s


class Maintenance:
    """Runs each job when it is due. A job's failure is logged and never stops the others;
    the first run of each is one interval after the start."""

    def __init__(self, jobs: Sequence[Job], *, clock: Callable[[], float], start_s: float) -> None:
        self._jobs = list(jobs)
        self._clock = clock
        self._last_run_s = {job.name: start_s for job in self._jobs}

    def run_due(self, *, go_on: Callable[[], bool] = lambda: True) -> float:
        """Run the jobs that are due, each only if `go_on()` still says so when its turn
        comes; returns the seconds until the next one is due."""
        for job in self._jobs:
            if not go_on():
                break
            if not due(
                last_run_s=self._last_run_s[job.name],
                interval_s=job.interval_s,
                now_s=self._clock(),
            ):
                continue
            self._last_run_s[job.name] = self._clock()
            try:
                job.run()
            except PipelineError as exc:
                log.warning("maintenance_failed", job=job.name, error=str(exc))
            except Exception:
                log.exception("maintenance_crashed", job=job.name)
        now_s = self._clock()
        return min(
            (self._last_run_s[job.name] + job.interval_s - now_s for job in self._jobs),
            default=1.0,
        )


# How often an idle maintenance thread looks whether the lock is still held: a lost lock
# stops it within this, between two jobs.
CHECK_EVERY_S = 0.25


class MaintenanceThread:
    """Runs `Maintenance` on a daemon thread while `active()` says the beat holds the lock.

    A job under way when the lock is lost runs to its end (a database transaction is not
    cut off from another thread); no other job starts after it, and the thread ends.
    `ensure_running` starts a thread only when none is alive, so two maintenance runs of
    one beat never overlap. The jobs' timing outlives the threads: a beat that loses the
    lock and takes it again runs what fell due meanwhile, and an hourly job is not put
    off by each loss."""

    def __init__(
        self,
        jobs: Sequence[Job],
        *,
        active: Callable[[], bool],
        stopping: threading.Event,
        clock: Callable[[], float] = time.monotonic,
        name: str = "maintenance",
    ) -> None:
        self._maintenance = Maintenance(jobs, clock=clock, start_s=clock())
        self._active = active
        self._stopping = stopping
        # Ends itself (`STOP`) once it may not go on; `ensure_running` starts it again.
        self._loop = LoopThread(self._step, name=f"beat-{name}", every_s=CHECK_EVERY_S)

    def _go_on(self) -> bool:
        return self._active() and not self._stopping.is_set()

    def ensure_running(self) -> None:
        """Start the thread, unless one is alive (it may still be ending a job)."""
        self._loop.start()

    def _step(self) -> float:
        if self._go_on():
            wait_s = self._maintenance.run_due(go_on=self._go_on)
            if self._go_on():
                return min(max(wait_s, 0.0), CHECK_EVERY_S)
        log.info("maintenance_stopped", thread=self._loop.name, lock_held=self._active())
        return STOP

    def join(self, *, timeout_s: float) -> bool:
        """Wait for the thread (after `stopping` is set); returns whether it has ended."""
        self._loop.wake()  # to see `stopping` now, not at its next look
        return self._loop.join(timeout_s=timeout_s)


class MaintenanceThreads:
    """A `MaintenanceThread` for each `Job.thread` of `jobs`: a long job of one thread holds
    up none of another's."""

    def __init__(
        self,
        jobs: Sequence[Job],
        *,
        active: Callable[[], bool],
        stopping: threading.Event,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        by_thread: dict[str, list[Job]] = {}
        for job in jobs:
            by_thread.setdefault(job.thread, []).append(job)
        self._threads = [
            MaintenanceThread(group, active=active, stopping=stopping, clock=clock, name=name)
            for name, group in by_thread.items()
        ]

    def ensure_running(self) -> None:
        for thread in self._threads:
            thread.ensure_running()

    def join(self, *, timeout_s: float) -> bool:
        """Wait for every thread (after `stopping` is set), `timeout_s` in all; returns
        whether all have ended."""
        deadline = time.monotonic() + timeout_s
        ended = [t.join(timeout_s=max(0.0, deadline - time.monotonic())) for t in self._threads]
        return all(ended)
