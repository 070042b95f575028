"""An operator's switch of a schedule, from the API: enable or disable it, with its audit
row in the same transaction."""

from __future__ import annotations

from datetime import datetime

from app.journal import audit
from app.journal.audit import Action
from app.journal.journal import Journal
from app.schedules import store
from app.schedules.store import Schedule


def switch(
    journal: Journal,
    name: str,
    *,
    enabled: bool,
    actor: str,
    reason: str | None,
    now: datetime,
) -> Schedule:
    """Enable (it fires from `now` on, with no catch-up of the time it was off) or disable
    the schedule `name`, audited as `actor`; returns it as it now is. Switching it to what
    it already is changes nothing and writes no row. Raises `ScheduleNotFound`,
    `JournalUnavailable`."""
    action = Action.SCHEDULE_ENABLE if enabled else Action.SCHEDULE_DISABLE
    with journal.transaction(f"schedule {action.value}") as conn:
        before = store.get(conn, name)
        if before.enabled == enabled:
            return before
        store.set_enabled(conn, name, enabled=enabled, now=now)
        audit.write(
            conn,
            actor=actor,
            action=action,
            target=f"schedule:{name}",
            params={},
            result={"enabled" if enabled else "disabled": 1},
            reason=reason,
            now=now,
        )
        return store.get(conn, name)
