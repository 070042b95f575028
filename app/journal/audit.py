"""The audit log: who did what to which records or lines, with what result and why.

Every operator action writes one row, in the transaction of what it did where there is
one (so an action and its row commit together): a replay, a retry or a cancel (of one
record or by filter), a pause or a resume of a line, a schedule added, removed, enabled or
disabled. A dry run is not an action and writes nothing. Retention never deletes a row."""

from __future__ import annotations

import getpass
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, insert, select

from app.ids import new_id
from app.journal.models import audit_log

# How much of a reason is kept.
MAX_REASON_LENGTH = 500


class Action(StrEnum):
    """What an operator did."""

    REPLAY = "replay"
    RETRY = "retry"
    CANCEL = "cancel"
    PAUSE = "pause"
    RESUME = "resume"
    SCHEDULE_ADD = "schedule_add"
    SCHEDULE_REMOVE = "schedule_remove"
    SCHEDULE_ENABLE = "schedule_enable"
    SCHEDULE_DISABLE = "schedule_disable"


@dataclass(frozen=True, kw_only=True)
class AuditEntry:
    """One row of the audit log."""

    id: str
    at: datetime
    actor: str
    action: Action
    target: str
    params: dict[str, Any]
    result: dict[str, Any] | None
    reason: str | None

    def public(self) -> dict[str, Any]:
        """The entry as the API answers it (time in ISO 8601 UTC)."""
        return {
            "id": self.id,
            "time": self.at.isoformat(),
            "actor": self.actor,
            "action": self.action.value,
            "target": self.target,
            "params": self.params,
            "result": self.result,
            "reason": self.reason,
        }


def cli_actor() -> str:
    """The actor of an action taken from the command line: `cli:<user>`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        user = "unknown"
    return f"cli:{user}"


def write(  # noqa: PLR0913 - one row's columns, keyword-only
    conn: Connection,
    *,
    actor: str,
    action: Action,
    target: str,
    params: Mapping[str, Any],
    result: Mapping[str, Any] | None,
    reason: str | None,
    now: datetime,
) -> AuditEntry:
    """Write one row in `conn`'s transaction (the caller commits it)."""
    entry = AuditEntry(
        id=new_id(now),
        at=now,
        actor=actor,
        action=action,
        target=target,
        params=dict(params),
        result=None if result is None else dict(result),
        reason=None if reason is None else reason[:MAX_REASON_LENGTH],
    )
    conn.execute(
        insert(audit_log).values(
            id=entry.id,
            at=entry.at,
            actor=entry.actor,
            action=entry.action.value,
            target=entry.target,
            params=entry.params,
            result=entry.result,
            reason=entry.reason,
        )
    )
    return entry


def newest(
    conn: Connection, *, limit: int, before: str | None = None, target: str | None = None
) -> list[AuditEntry]:
    """The newest `limit` rows, newest first; `before`: only those older than that id (the
    cursor of the previous page); `target`: only those whose target is that one (e.g.
    `record:<id>`, `line:order`, `schedule:nightly`)."""
    query = select(audit_log).order_by(audit_log.c.id.desc()).limit(limit)
    if before is not None:
        query = query.where(audit_log.c.id < before)
    if target is not None:
        query = query.where(audit_log.c.target == target)
    return [
        AuditEntry(
            id=row.id,
            at=row.at,
            actor=row.actor,
            action=Action(row.action),
            target=row.target,
            params=row.params,
            result=row.result,
            reason=row.reason,
        )
        for row in conn.execute(query)
    ]
