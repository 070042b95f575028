"""Journal retention: deletes the records of every final status once they are old enough,
never an unfinished one. `done` records go `days` after they finished; the undelivered ones
(`dead`, `rejected`, `cancelled`) `undelivered_days` after they became so. Run by the
active beat.

A run deletes every expired record, oldest first (by when it became final, whatever its
status), in batches of `batch_size`, each its own short transaction. After each batch it
pauses as long as the batch took, so the intake keeps half the journal's time and a core
while a purge runs (on SQLite a writer waiting for its turn goes before the next batch).
It ends when nothing expired is left or after `budget_s`; the next run goes on from there.
A record's attempts go with it; the audit log keeps every row, and the sink's tables hold
the delivered effect, not the record."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.journal import expiry
from app.journal.journal import Journal
from app.telemetry.logs import get_logger

log = get_logger(__name__)

# The longest a run goes on by default (RETENTION_MAX_RUN_SECONDS): a quarter of the
# default hourly interval. Paced, a run deletes ~30,000 records/s on the bench's 2-core
# machine (SQLite, 1,000 to a batch): some 27 million a run, far above what an hour of
# intake at ~2,000 records/s leaves behind.
RUN_BUDGET_S = 900.0
# The pause after a batch, as a share of the time the batch took, and at least this long.
# Measured (`pipeline bench`, 1,000,000 records, SQLite): no pause deleted 54,000
# records/s with the intake's p99 at 4.5x; a pause as long as the batch 31,000 records/s
# with its p99 at 1.4x.
BATCH_PAUSE_SHARE = 1.0
BATCH_PAUSE_S = 0.001


@dataclass(frozen=True, kw_only=True)
class Retention:
    """Deletes old final records."""

    journal: Journal
    # `done` records older than this many days go; 0 keeps them.
    days: float
    # `dead`, `rejected` and `cancelled` records older than this many days go; 0 keeps them.
    undelivered_days: float
    batch_size: int
    budget_s: float = RUN_BUDGET_S
    pause_share: float = BATCH_PAUSE_SHARE
    pause_s: float = BATCH_PAUSE_S
    # Seconds, for the budget (a clock the tests may move), and the pause between batches.
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def cutoffs(self, now: datetime) -> expiry.Cutoffs:
        """The times before which final records are expired at `now`."""
        return expiry.Cutoffs(
            done=now - timedelta(days=self.days) if self.days > 0 else None,
            undelivered=(
                now - timedelta(days=self.undelivered_days) if self.undelivered_days > 0 else None
            ),
        )

    def purge(
        self,
        *,
        now: datetime,
        max_batches: int | None = None,
        go_on: Callable[[], bool] = lambda: True,
    ) -> int:
        """Delete the final records expired at `now` (`cutoffs`), oldest first, until none
        is left, `budget_s` has passed, `max_batches` (None: no limit) ran, or `go_on()`
        says no before a batch (the beat lost its lock). Returns how many. Raises
        `JournalUnavailable` (what was deleted before stays deleted)."""
        cutoffs = self.cutoffs(now)
        if not cutoffs.by_status():
            return 0
        before = {
            "done_before": cutoffs.done.isoformat() if cutoffs.done else None,
            "undelivered_before": cutoffs.undelivered.isoformat() if cutoffs.undelivered else None,
        }
        deadline = self.clock() + self.budget_s
        deleted = batches = 0
        while (max_batches is None or batches < max_batches) and go_on():
            began_s = self.clock()
            with self.journal.transaction("retention") as conn:
                batch = expiry.delete_expired(conn, cutoffs, limit=self.batch_size)
            deleted += batch
            batches += 1
            if batch < self.batch_size:
                break
            ended_s = self.clock()
            if ended_s >= deadline:
                log.warning(
                    "retention_out_of_time", deleted=deleted, budget_s=self.budget_s, **before
                )
                break
            self.sleep(max(self.pause_s, (ended_s - began_s) * self.pause_share))
        if deleted:
            log.info("retention_finished", deleted=deleted, batches=batches, **before)
        return deleted
