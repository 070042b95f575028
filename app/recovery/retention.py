"""Journal retention: deletes `done` records older than the retention age, in batches,
never an unfinished one. Run by the active beat."""

from __future__ import annotations

from datetime import datetime, timedelta

from app.journal import store
from app.logs import get_logger
from app.runtime import Runtime

log = get_logger(__name__)


def purge(rt: Runtime, *, now: datetime, max_batches: int = 100) -> int:
    """Delete old `done` records; returns how many. Raises `JournalUnavailable`."""
    if rt.settings.retention_days <= 0:
        return 0
    before = now - timedelta(days=rt.settings.retention_days)
    deleted = 0
    for _ in range(max_batches):
        with rt.journal.transaction("retention") as conn:
            batch = store.delete_done_before(
                conn, before=before, limit=rt.settings.retention_batch_size
            )
        deleted += batch
        if batch < rt.settings.retention_batch_size:
            break
    if deleted:
        log.info("retention_finished", deleted=deleted, before=before.isoformat())
    return deleted
