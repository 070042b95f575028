"""`PipelineScheduler`: Celery beat that fires the cron schedules and runs the pipeline's
maintenance jobs (`beat.maintenance`) itself, under one lock: only the active beat does
either.

Three threads, none waiting for another: the lock's `Renewer` renews (or stands by) on its
own cadence; Celery's loop ticks once a second and fires the due schedules; the
`MaintenanceThread` runs the maintenance jobs one after another. A lost lock stops the
firing at once and the maintenance after the job under way."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from celery.beat import Scheduler

from app.celery_app import pipeline_settings
from app.clock import utcnow
from app.errors import PipelineError
from app.observe.health import note_active_beat, note_sweep
from app.telemetry.events import Event
from app.telemetry.logs import get_logger
from app.wiring.runtime import Runtime
from beat.lock import BeatLock, Renewer
from beat.maintenance import Job, MaintenanceThreads

log = get_logger(__name__)

# The lock is renewed every second, or three times per TTL when that is shorter: a renewal
# or two may fail (a Redis blip) before the lock is lost.
RENEW_EVERY_S = 1.0
# How long a stopping beat waits for its threads before it leaves them (daemons) behind.
STOP_TIMEOUT_S = 2.0
# Fires are due on whole seconds: a tick this long after one finds it due.
TICK_AFTER_SECOND_S = 0.01


def until_next_tick(now: datetime) -> float:
    """Seconds from `now` to just after the next whole second."""
    return 1.0 - now.microsecond / 1_000_000 + TICK_AFTER_SECOND_S


class PipelineScheduler(Scheduler):
    """A beat scheduler that fires the schedules and runs maintenance in-process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._runtime: Runtime | None = None
        self._lock: BeatLock | None = None
        self._renewer: Renewer | None = None
        self._maintenance: MaintenanceThreads | None = None
        self._stopping = threading.Event()
        super().__init__(*args, **kwargs)

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = Runtime.build(
                pipeline_settings(self.app), db_pool_size=2, component="beat"
            )
        return self._runtime

    @property
    def lock(self) -> BeatLock:
        if self._lock is None:
            self._lock = BeatLock(
                self.runtime.redis, ttl_s=pipeline_settings(self.app).beat_lock_ttl_seconds
            )
        return self._lock

    def maintenance_jobs(self) -> list[Job]:
        """The jobs the maintenance thread runs, built once, when the beat first ticks. A
        subclass (`pipeline beat --scheduler`) may add its own or wrap these."""
        rt = self.runtime
        settings = rt.settings
        return [
            Job(
                name="sweep",
                interval_s=settings.sweep_interval_seconds,
                run=self._sweep,
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
                run=lambda: rt.retention.purge(now=utcnow(), go_on=self._maintaining),
                # A big purge takes minutes: the sweeper must not wait for it.
                thread="retention",
            ),
        ]

    def _sweep(self) -> None:
        """One sweep, then its time noted for the console's health strip."""
        rt = self.runtime
        rt.sweeper.sweep(now=utcnow())
        note_sweep(rt.redis, at=utcnow())

    def _maintaining(self) -> bool:
        """Whether maintenance may go on: this beat holds the lock and is not stopping."""
        return self.lock.active_since() is not None and not self._stopping.is_set()

    def _started(self) -> MaintenanceThreads:
        """Start the lock's renewal and build the maintenance threads, once; returns them."""
        if self._maintenance is not None:
            return self._maintenance
        lock = self.lock
        self._maintenance = MaintenanceThreads(
            self.maintenance_jobs(),
            active=lambda: lock.active_since() is not None,
            stopping=self._stopping,
        )
        self._renewer = Renewer(
            lock, every_s=min(RENEW_EVERY_S, lock.ttl_s / 3), on_result=self._on_lock_result
        )
        self._renewer.start()
        return self._maintenance

    def _on_lock_result(self, held: bool, took_over_from: str | None) -> None:
        """Alerts on the renewer's results. `Alerter.raise_event` never raises."""
        lock = self.lock
        if not held and lock.last_error is not None:
            # No beat can hold the lock, so no monitor runs: say so from here.
            self.runtime.alerts.raise_event(
                Event.BROKER_DOWN,
                line=None,
                message=f"Redis does not answer: {lock.last_error}",
            )
        if took_over_from is not None:
            self.runtime.alerts.raise_event(
                Event.BEAT_TAKEOVER,
                line=None,
                message=f"beat {lock.identity} took over from {took_over_from}",
                previous=took_over_from,
            )

    def tick(self, *_args: Any, **_kwargs: Any) -> float:
        """One beat: while this beat holds the lock, fire the due schedules and keep the
        maintenance thread running; standing by, nothing.

        Returns the seconds to sleep: until just after the next whole second."""
        maintenance = self._started()
        active_since = self.lock.active_since()
        if active_since is not None:
            maintenance.ensure_running()
            lock = self.lock
            note_active_beat(
                self.runtime.redis, identity=lock.identity, since=active_since, ttl_s=lock.ttl_s
            )
            try:
                self.runtime.firer.fire_due(now=utcnow(), active_since=active_since)
            except PipelineError as exc:
                log.warning("schedules_failed", error=str(exc))
        return until_next_tick(utcnow())

    def setup_schedule(self) -> None:
        """No Celery beat entries: every job of the pipeline's beat is above, and none is a
        message for a worker (Celery's default entries would be)."""

    def close(self) -> None:
        """Stop renewing and maintaining, then give the lock up: only when both threads
        have ended, so no other beat starts maintenance beside a job of this one still
        running (else the lock lapses after its TTL)."""
        self._stopping.set()
        renewer_ended = self._renewer is None or self._renewer.stop(timeout_s=STOP_TIMEOUT_S)
        maintenance_ended = self._maintenance is None or self._maintenance.join(
            timeout_s=STOP_TIMEOUT_S
        )
        if self._lock is not None and renewer_ended and maintenance_ended:
            self._lock.release()
        if self._runtime is not None:
            self._runtime.close()
        super().close()
