"""The journal's paused lines: a row per line while an operator has it paused.

The journal is where a pause lives, so it outlasts a restart of any component and of
Redis; every process reads it (`app.admission.pause.PausedLines` keeps a copy at most a
second old). Like `app.journal.store`, every function takes a connection and never
commits: the caller owns the transaction (and writes the audit row in it)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, select
from sqlalchemy.dialects import postgresql, sqlite

from app.errors import JournalUnavailable
from app.journal.models import line_pauses


@dataclass(frozen=True, kw_only=True)
class LinePause:
    """A paused line: since when, by whom, why."""

    line: str
    paused_at: datetime
    actor: str
    reason: str | None

    def public(self) -> dict[str, Any]:
        """As the API answers it (time in ISO 8601 UTC)."""
        return {"since": self.paused_at.isoformat(), "by": self.actor, "reason": self.reason}


def _from_row(row: Any) -> LinePause:
    return LinePause(line=row.line, paused_at=row.paused_at, actor=row.actor, reason=row.reason)


def pause(
    conn: Connection, line: str, *, actor: str, reason: str | None, now: datetime
) -> tuple[LinePause, bool]:
    """Pause `line` unless it is paused. Returns its pause and whether this call made it
    (a line paused already keeps its first pause: time, actor and reason)."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    statement = (
        dialect.insert(line_pauses)
        .values(line=line, paused_at=now, actor=actor, reason=reason)
        .on_conflict_do_nothing(index_elements=[line_pauses.c.line])
        .returning(line_pauses.c.line)
    )
    # Twice at most: a pause that another transaction ends between the two statements
    # leaves nothing to read, and the second insert then makes ours.
    for _ in range(2):
        made = conn.execute(statement).first() is not None
        found = get(conn, line)
        if found is not None:
            return found, made
    raise JournalUnavailable(f"pausing {line!r} raced with resumes of it twice")


def resume(conn: Connection, line: str) -> LinePause | None:
    """Resume `line`. Returns the pause it ended; None when it was not paused."""
    found = conn.execute(
        delete(line_pauses).where(line_pauses.c.line == line).returning(*line_pauses.c)
    ).first()
    return None if found is None else _from_row(found)


def get(conn: Connection, line: str) -> LinePause | None:
    """`line`'s pause; None when it is not paused."""
    row = conn.execute(select(line_pauses).where(line_pauses.c.line == line)).first()
    return None if row is None else _from_row(row)


def paused(conn: Connection) -> dict[str, LinePause]:
    """Every paused line's pause, by line."""
    return {row.line: _from_row(row) for row in conn.execute(select(line_pauses))}
