"""Paused lines, as each process sees them: the journal's pauses (`app.journal.pauses`),
read at most once a `PAUSES_LIFETIME_S`, and what a worker does with a record of a paused
line that it took from its queue.

The intake defers a paused line's new records, the sweeper pushes nothing of it, and a
worker starts no attempt of it: each asks `PausedLines`, so all of them see a pause (or a
resume) within `PAUSES_LIFETIME_S` of its commit, on every host."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy import Connection

from app.errors import JournalUnavailable
from app.journal import pauses, store
from app.journal.journal import Journal
from app.journal.pauses import LinePause
from app.journal.transitions import Event
from app.logs import get_logger
from app.observe.recent import Recent

log = get_logger(__name__)

# How old a process's view of the pauses may be: a pause takes hold everywhere within
# this (the contract promises 2 s; a read of a one-row-per-paused-line table a second per
# process costs nothing).
PAUSES_LIFETIME_S = 1.0


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

    def forget(self) -> None:
        """Read the journal again at the next ask (this process has just changed it)."""
        self._recent = Recent[dict[str, LinePause]](lifetime_s=self._lifetime_s, clock=self._clock)

    def _read(self) -> dict[str, LinePause]:
        try:
            with self._journal.reading("reading the paused lines") as conn:
                found = pauses.paused(conn)
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
