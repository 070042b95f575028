"""Pausing and resuming a line: the operator's action, from the API or the command line.

A pause is a row in the journal (`app.journal.pauses`), written with its audit row in one
transaction. A resume removes it and first keeps the line's new records behind the ones
that waited while it was paused (`Waiting.keep_behind`): the sweeper pushes those first,
oldest first, and new records go straight onto the queue again once a pass finds nothing
of the line left."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.delivery.paused import PausedLines
from app.delivery.waiting import Waiting
from app.errors import BrokerUnavailable
from app.journal import audit, pauses
from app.journal.audit import Action
from app.journal.journal import Journal
from app.journal.pauses import LinePause
from app.lines import LineRegistry
from app.logs import get_logger

log = get_logger(__name__)


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
            pause, made = pauses.pause(conn, line.name, actor=actor, reason=reason, now=now)
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
            ended = pauses.resume(conn, line.name)
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
