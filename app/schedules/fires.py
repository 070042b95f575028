"""Firing the cron schedules: for each due fire, a journal record with dedup key
`schedule:<name>:<fire time>` through the same bounded admission as the intake. A fire
made twice (two beats, a restart) is stored and run once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.admission.accept import Acceptor
from app.config.line_settings import Overflow
from app.errors import PipelineError
from app.ids import digest, new_id, schedule_key
from app.journal.journal import Journal
from app.journal.models import Source
from app.journal.store import NewRecord
from app.schedules.cron import next_fire, plan
from app.schedules.store import Schedule, fire_payload, list_all, record_fired
from app.telemetry.logs import get_logger

log = get_logger(__name__)


def dedup_key(name: str, fire: datetime) -> str:
    # Its own namespace, which no intake key id may take (app.ids).
    return schedule_key(name, fire)


@dataclass(frozen=True, kw_only=True)
class ScheduleFirer:
    """Fires the due times of the enabled schedules, each through `Acceptor` like an intake
    request."""

    journal: Journal
    acceptor: Acceptor

    def fire_due(self, *, now: datetime, active_since: datetime) -> int:
        """Fire every enabled schedule's due times, for a beat that has held the lock
        since `active_since` (fires due before then were missed: `plan`). Returns how many
        records were created.

        Raises `JournalUnavailable` when the schedules cannot be read."""
        with self.journal.reading("reading schedules") as conn:
            current = list_all(conn, enabled_only=True)
        created = 0
        for schedule in current:
            try:
                created += self._fire_schedule(schedule, now=now, active_since=active_since)
            except PipelineError as exc:
                log.warning("schedule_fire_failed", schedule=schedule.name, error=str(exc))
        return created

    def _fire_schedule(self, schedule: Schedule, *, now: datetime, active_since: datetime) -> int:
        todo = plan(
            schedule.cron,
            schedule.timezone,
            policy=schedule.misfire,
            catchup_window_s=schedule.catchup_window_s,
            after=schedule.last_fire_at or schedule.created_at,
            active_since=active_since,
            now=now,
        )
        if todo.fired_through is None:
            return 0
        created = 0
        for fire in todo.fire:
            payload = fire_payload(schedule, fire)
            new = NewRecord(
                id=new_id(now),
                line=schedule.line,
                business_no=str(payload["business_no"]),
                source=Source.SCHEDULE,
                dedup_key=dedup_key(schedule.name, fire),
                body_sha256=digest(repr(sorted(payload.items())).encode()),
                payload=payload,
            )
            # Deferred when the line is full, whatever its policy: no caller is there to send a
            # rejected fire again, and beat runs no handler (caller_runs); the sweeper pushes it.
            result = self.acceptor.accept(new, clock=lambda: now, overflow=Overflow.DEFER)
            if result.created:
                created += 1
                log.info("schedule_fired", schedule=schedule.name, fire=fire.isoformat())
        if not todo.fire:
            log.info("schedule_missed_fires_skipped", schedule=schedule.name)
        with self.journal.transaction("recording the fire") as conn:
            record_fired(
                conn,
                schedule.name,
                through=todo.fired_through,
                next_at=next_fire(schedule.cron, schedule.timezone, after=now),
                now=now,
            )
        return created
