"""`PipelineScheduler`: Celery beat with the pipeline's maintenance entries (DESIGN §10).

Maintenance (the sweeper for now) runs inside the beat process itself, not as messages for
workers: it must keep working when every queue is full or no worker is alive."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import schedule

from app.clock import utcnow
from app.errors import PipelineError
from app.logs import get_logger
from app.observe.monitor import monitor
from app.observe.webhooks import Event
from app.recovery.lost_messages import recover_lost
from app.recovery.retention import purge
from app.recovery.sweeper import sweep
from app.runtime import Runtime
from app.schedules.fires import fire_due
from beat.lock import BeatLock

log = get_logger(__name__)

SWEEP_ENTRY = "pipeline.sweep"
MONITOR_ENTRY = "pipeline.monitor"
RETENTION_ENTRY = "pipeline.retention"
LOST_ENTRY = "pipeline.lost_messages"


class PipelineScheduler(Scheduler):  # type: ignore[misc]  # Celery ships no type hints
    """A beat scheduler that runs the maintenance entries in-process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._runtime: Runtime | None = None
        self._lock: BeatLock | None = None
        self._local: dict[str, Callable[[], None]] = {
            SWEEP_ENTRY: self._sweep,
            MONITOR_ENTRY: self._monitor,
            RETENTION_ENTRY: self._retention,
            LOST_ENTRY: self._lost,
        }
        super().__init__(*args, **kwargs)

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = Runtime.build(self.app.pipeline_settings, db_pool_size=2)
        return self._runtime

    @property
    def lock(self) -> BeatLock:
        if self._lock is None:
            self._lock = BeatLock(
                self.runtime.redis, ttl_s=self.app.pipeline_settings.beat_lock_ttl_seconds
            )
        return self._lock

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One beat: hold the lock (or stand by), fire the due schedules, run maintenance.

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
        try:
            fire_due(self.runtime, now=utcnow())
        except PipelineError as exc:
            log.warning("schedules_failed", error=str(exc))
        interval: float = super().tick(*args, **kwargs)
        return min(interval, 1.0)

    def setup_schedule(self) -> None:
        settings = self.app.pipeline_settings
        self.merge_inplace(
            {
                SWEEP_ENTRY: {
                    "task": SWEEP_ENTRY,
                    "schedule": schedule(timedelta(seconds=settings.sweep_interval_seconds)),
                },
                MONITOR_ENTRY: {
                    "task": MONITOR_ENTRY,
                    "schedule": schedule(timedelta(seconds=settings.monitor_interval_seconds)),
                },
                RETENTION_ENTRY: {
                    "task": RETENTION_ENTRY,
                    "schedule": schedule(timedelta(seconds=settings.retention_interval_seconds)),
                },
                LOST_ENTRY: {
                    "task": LOST_ENTRY,
                    "schedule": schedule(timedelta(seconds=settings.lost_check_interval_seconds)),
                },
            }
        )

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        local = self._local.get(entry.name)
        if local is None:
            super().apply_entry(entry, producer=producer)
            return
        try:
            local()
        except PipelineError as exc:
            log.warning("maintenance_failed", entry=entry.name, error=str(exc))
        except Exception:
            log.exception("maintenance_crashed", entry=entry.name)

    def _sweep(self) -> None:
        sweep(self.runtime, now=utcnow())

    def _monitor(self) -> None:
        monitor(self.runtime, now=utcnow())

    def _retention(self) -> None:
        purge(self.runtime, now=utcnow())

    def _lost(self) -> None:
        recover_lost(self.runtime, now=utcnow())

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
        if self._runtime is not None:
            self._runtime.close()
        super().close()
