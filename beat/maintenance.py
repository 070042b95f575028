"""The maintenance jobs of the active beat: each runs every `interval_s`, in the beat's own
process and under its lock (the sweeper, the lost-message check, the monitor, retention).

They are not Celery beat entries: nothing is sent to a worker, so they keep working when
every queue is full or no worker is alive."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.errors import PipelineError
from app.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class Job:
    """One maintenance job: its name (in logs), how often it runs, what it runs."""

    name: str
    interval_s: float
    run: Callable[[], object]


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

    def run_due(self) -> float:
        """Run the jobs that are due; returns the seconds until the next one is."""
        for job in self._jobs:
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
