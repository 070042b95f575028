"""Pausing a line: the operator's action, and what every process does with it.

A pause is a row in the journal (`line_pauses`, read and written here alone), written with
its audit row in one transaction (`LinePauser`): the journal is where a pause lives, so it
outlasts a restart of any component and of Redis. Each process reads the pauses at most once a
`PAUSES_LIFETIME_S` (`PausedLines`): the intake defers a paused line's new records, the
sweeper pushes nothing of it, and a worker claims nothing more of it, also inside a
message already running (`hold_back`), so all of them see a pause (or a resume) within
`PAUSES_LIFETIME_S` of its commit, on every host. A resume removes the row and first keeps
the line's new records behind the ones that waited while it was paused
(`Waiting.keep_behind`): the sweeper pushes those first, oldest first, and new records go
straight onto the queue again once a pass finds nothing of the line left."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, select
from sqlalchemy.dialects import postgresql, sqlite

from app.admission.waiting import Waiting
from app.errors import BrokerUnavailable, JournalUnavailable
from app.journal import audit, store
from app.journal.audit import Action
from app.journal.journal import Journal
from app.journal.models import line_pauses
from app.journal.transitions import Event
from app.lines import LineRegistry
from app.telemetry.logs import get_logger
from app.threads import Recent

log = get_logger(__name__)

# How old a process's view of the pauses may be: a pause takes hold everywhere within
# this (the contract promises 2 s; a read of a one-row-per-paused-line table a second per
# process costs nothing).
PAUSES_LIFETIME_S = 1.0


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


def _insert_pause(
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
        found = _read_pause(conn, line)
        if found is not None:
            return found, made
    raise JournalUnavailable(f"pausing {line!r} raced with resumes of it twice")


def _delete_pause(conn: Connection, line: str) -> LinePause | None:
    """Resume `line`. Returns the pause it ended; None when it was not paused."""
    found = conn.execute(
        delete(line_pauses).where(line_pauses.c.line == line).returning(*line_pauses.c)
    ).first()
    return None if found is None else _from_row(found)


def _read_pause(conn: Connection, line: str) -> LinePause | None:
    """`line`'s pause; None when it is not paused."""
    row = conn.execute(select(line_pauses).where(line_pauses.c.line == line)).first()
    return None if row is None else _from_row(row)


def _read_pauses(conn: Connection) -> dict[str, LinePause]:
    """Every paused line's pause, by line."""
    return {row.line: _from_row(row) for row in conn.execute(select(line_pauses))}


class PausedLines:
    """The paused lines, read from the journal at most once a `lifetime_s`, however many
    threads ask. A journal that does not answer leaves the last view in place (a process
    that never read it sees no line paused: the journal being down, no attempt or sweep
    can start anyway)."""

    def __init__(
        self,
        journal: Journal,
        *,
        lifetime_s: float = PAUSES_LIFETIME_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._journal = journal
        self._lifetime_s = lifetime_s
        self._clock = clock
        self._recent = Recent[dict[str, LinePause]](lifetime_s=lifetime_s, clock=clock)
        self._last: dict[str, LinePause] = {}

    def current(self) -> dict[str, LinePause]:
        """Every paused line's pause, by line, as read at most `lifetime_s` ago."""
        return self._recent.get(self._read)

    def is_paused(self, line: str) -> bool:
        return line in self.current()

    def known(self) -> dict[str, LinePause] | None:
        """Every paused line's pause, if read less than `lifetime_s` ago; None: it is due a
        read (`read_in`). Never waits."""
        return self._recent.fresh()

    def read_in(self, conn: Connection) -> dict[str, LinePause]:
        """Read the paused lines on `conn` (a caller's transaction) and keep them."""
        began_at = self._clock()
        found = _read_pauses(conn)
        self._last = found
        self._recent.keep(found, began_at=began_at)
        return found

    def last(self) -> dict[str, LinePause]:
        """The paused lines as last read (none when never read)."""
        return self._last

    def forget(self) -> None:
        """Read the journal again at the next ask (this process has just changed it)."""
        self._recent = Recent[dict[str, LinePause]](lifetime_s=self._lifetime_s, clock=self._clock)

    def _read(self) -> dict[str, LinePause]:
        try:
            with self._journal.reading("reading the paused lines") as conn:
                found = _read_pauses(conn)
        except JournalUnavailable as exc:
            log.warning("paused_lines_unread", error=str(exc), kept=sorted(self._last))
            return self._last
        self._last = found
        return found


def hold_back(conn: Connection, record_ids: Sequence[str], *, now: datetime) -> int:
    """A worker took the message of `record_ids` from a paused line's queue (or its line
    was paused while the message ran): no attempt of them starts, and each record that is
    not in flight elsewhere waits in the journal as `deferred` (from `enqueued`, as a push
    that did not lead to an attempt; from `received`, as a push the intake has not recorded
    yet), for the sweeper to push after the resume, oldest first. Final or failed records,
    and those under a live lease, are left as they are. Returns how many were moved."""
    moved = store.move(conn, record_ids, Event.NOT_PUSHED, now=now)
    return moved + store.move(conn, record_ids, Event.DEFERRED, now=now)


@dataclass(frozen=True, kw_only=True)
class PauseState:
    """A line's pause after an action: `pause` None when it is not paused; `changed`
    False when the line already was as asked."""

    line: str
    pause: LinePause | None
    changed: bool

    def public(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "paused": self.pause is not None,
            "pause": None if self.pause is None else self.pause.public(),
            "changed": self.changed,
        }


@dataclass(frozen=True, kw_only=True)
class LinePauser:
    """Pauses and resumes lines, each action with its audit row."""

    journal: Journal
    waiting: Waiting
    lines: LineRegistry
    paused: PausedLines

    def pause(self, line_name: str, *, actor: str, reason: str | None, now: datetime) -> PauseState:
        """Pause the line (already paused: it keeps its first pause; the action is still
        audited). Raises `UnknownLine`, `JournalUnavailable`."""
        line = self.lines.get(line_name)
        with self.journal.transaction(f"pausing {line.name!r}") as conn:
            pause, made = _insert_pause(conn, line.name, actor=actor, reason=reason, now=now)
            audit.write(
                conn,
                actor=actor,
                action=Action.PAUSE,
                target=f"line:{line.name}",
                params={},
                result={"paused": True, "changed": made},
                reason=reason,
                now=now,
            )
        self.paused.forget()
        log.info("line_paused", line=line.name, actor=actor, changed=made)
        return PauseState(line=line.name, pause=pause, changed=made)

    def resume(
        self, line_name: str, *, actor: str, reason: str | None, now: datetime
    ) -> PauseState:
        """Resume the line (not paused: nothing changes; the action is still audited).
        Raises `UnknownLine`, `JournalUnavailable`; a Redis that does not answer resumes
        the line all the same (its new records may then overtake those that waited)."""
        line = self.lines.get(line_name)
        try:
            self.waiting.keep_behind(line.queue)
        except BrokerUnavailable as exc:
            log.warning("resume_not_kept_behind", line=line.name, error=str(exc))
        with self.journal.transaction(f"resuming {line.name!r}") as conn:
            ended = _delete_pause(conn, line.name)
            audit.write(
                conn,
                actor=actor,
                action=Action.RESUME,
                target=f"line:{line.name}",
                params={},
                result={
                    "paused": False,
                    "changed": ended is not None,
                    "paused_since": None if ended is None else ended.paused_at.isoformat(),
                },
                reason=reason,
                now=now,
            )
        self.paused.forget()
        log.info("line_resumed", line=line.name, actor=actor, changed=ended is not None)
        return PauseState(line=line.name, pause=None, changed=ended is not None)
