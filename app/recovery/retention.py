"""Journal retention: deletes `done` records older than the retention age, in batches,
never an unfinished one. Run by the active beat."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from app.journal import store
from app.journal.journal import Journal
from app.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class Retention:
    """Deletes old `done` records."""

    journal: Journal
    # `done` records older than this many days go; 0 keeps everything.
    days: float
    batch_size: int

    def purge(self, *, now: datetime, max_batches: int = 100) -> int:
        """Delete old `done` records; returns how many. Raises `JournalUnavailable`."""
        if self.days <= 0:
            return 0
        before = now - timedelta(days=self.days)
        deleted = 0
        for _ in range(max_batches):
            with self.journal.transaction("retention") as conn:
                batch = store.delete_done_before(conn, before=before, limit=self.batch_size)
            deleted += batch
            if batch < self.batch_size:
                break
        if deleted:
            log.info("retention_finished", deleted=deleted, before=before.isoformat())
        return deleted
