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
from app.monitor import monitor
from app.retention import purge
from app.runtime import Runtime
from app.sweeper import sweep

log = get_logger(__name__)

SWEEP_ENTRY = "pipeline.sweep"
MONITOR_ENTRY = "pipeline.monitor"
RETENTION_ENTRY = "pipeline.retention"


class PipelineScheduler(Scheduler):  # type: ignore[misc]  # Celery ships no type hints
    """A beat scheduler that runs the maintenance entries in-process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._runtime: Runtime | None = None
        self._local: dict[str, Callable[[], None]] = {
            SWEEP_ENTRY: self._sweep,
            MONITOR_ENTRY: self._monitor,
            RETENTION_ENTRY: self._retention,
        }
        super().__init__(*args, **kwargs)

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = Runtime.build(self.app.pipeline_settings, db_pool_size=2)
        return self._runtime

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

    def close(self) -> None:
        if self._runtime is not None:
            self._runtime.close()
        super().close()
