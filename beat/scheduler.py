"""`PipelineScheduler`: Celery beat that fires the cron schedules and runs the pipeline's
maintenance jobs (`beat.maintenance`) itself, under one lock: only the active beat does
either."""

from __future__ import annotations

import time
from typing import Any

from celery.beat import Scheduler

from app.celery_app import pipeline_settings
from app.clock import utcnow
from app.errors import PipelineError
from app.logs import get_logger
from app.observe.events import Event
from app.runtime import Runtime
from beat.lock import BeatLock
from beat.maintenance import Job, Maintenance

log = get_logger(__name__)


class PipelineScheduler(Scheduler):
    """A beat scheduler that fires the schedules and runs maintenance in-process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._runtime: Runtime | None = None
        self._lock: BeatLock | None = None
        self._maintenance: Maintenance | None = None
        super().__init__(*args, **kwargs)

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = Runtime.build(pipeline_settings(self.app), db_pool_size=2)
        return self._runtime

    @property
    def lock(self) -> BeatLock:
        if self._lock is None:
            self._lock = BeatLock(
                self.runtime.redis, ttl_s=pipeline_settings(self.app).beat_lock_ttl_seconds
            )
        return self._lock

    @property
    def maintenance(self) -> Maintenance:
        if self._maintenance is None:
            rt = self.runtime
            settings = rt.settings
            jobs = [
                Job(
                    name="sweep",
                    interval_s=settings.sweep_interval_seconds,
                    run=lambda: rt.sweeper.sweep(now=utcnow()),
                ),
                Job(
                    name="lost_messages",
                    interval_s=settings.lost_check_interval_seconds,
                    run=lambda: rt.lost.recover_lost(now=utcnow()),
                ),
                Job(
                    name="monitor",
                    interval_s=settings.monitor_interval_seconds,
                    run=lambda: rt.monitor.monitor(now=utcnow()),
                ),
                Job(
                    name="retention",
                    interval_s=settings.retention_interval_seconds,
                    run=lambda: rt.retention.purge(now=utcnow()),
                ),
            ]
            self._maintenance = Maintenance(jobs, clock=time.monotonic, start_s=time.monotonic())
        return self._maintenance

    def tick(self, *_args: Any, **_kwargs: Any) -> float:
        """One beat: hold the lock (or stand by), fire the due schedules, run the due
        maintenance jobs.

        Returns the seconds to sleep: at most one, so a standby tries every second."""
        held, took_over_from = self.lock.hold()
        if not held:
            if self.lock.last_error is not None:
                # No beat can hold the lock, so no monitor runs: say so from here.
                self.runtime.alerts.raise_event(
                    Event.BROKER_DOWN,
                    line=None,
                    message=f"Redis does not answer: {self.lock.last_error}",
                )
            return 1.0
        if took_over_from is not None:
            self.runtime.alerts.raise_event(
                Event.BEAT_TAKEOVER,
                line=None,
                message=f"beat {self.lock.identity} took over from {took_over_from}",
                previous=took_over_from,
            )
        active_since = self.lock.active_since()
        if active_since is None:  # held, but the renewal took longer than the TTL
            return 1.0
        try:
            self.runtime.firer.fire_due(now=utcnow(), active_since=active_since)
        except PipelineError as exc:
            log.warning("schedules_failed", error=str(exc))
        return max(0.0, min(self.maintenance.run_due(), 1.0))

    def setup_schedule(self) -> None:
        """No Celery beat entries: every job of the pipeline's beat is above, and none is a
        message for a worker (Celery's default entries would be)."""

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
        if self._runtime is not None:
            self._runtime.close()
        super().close()
