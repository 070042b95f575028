"""What the API shows of the journal's records and of the lines' state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.journal.attempt_log import Attempt
from app.journal.models import Record
from app.observe.line_view import LineStatus


def record_view(record: Record, history: Sequence[Attempt] | None = None) -> dict[str, Any]:
    """A record as `GET /v1/records…` shows it: times in ISO 8601 UTC. With `history`
    (the record's attempts, oldest first), it shows them as `attempt_history`; `attempts`
    stays their count."""
    view: dict[str, Any] = {
        "id": record.id,
        "line": record.line,
        "business_no": record.business_no,
        "source": record.source.value,
        "dedup_key": record.dedup_key,
        "status": record.status.value,
        "attempts": record.attempts,
        "payload": record.payload,
        "last_error": record.last_error,
        "created_at": record.created_at.isoformat(),
        "updated_at": record.updated_at.isoformat(),
        "finished_at": record.finished_at.isoformat() if record.finished_at else None,
        "next_attempt_at": record.next_attempt_at.isoformat() if record.next_attempt_at else None,
    }
    if history is not None:
        view["attempt_history"] = [attempt.public() for attempt in history]
    return view


def line_status_view(row: LineStatus) -> dict[str, object]:
    """A line's status as `GET /v1/lines` shows it."""
    return {
        "line": row.line,
        "queue_depth": row.queue_depth,
        "max_queue_length": row.max_queue_length,
        "overflow": row.overflow,
        "live_workers": row.live_workers,
        "counts": row.counts,
        "oldest_unfinished_age_s": row.oldest_unfinished_age_s,
        "paused": row.paused,
        "pause": None if row.pause is None else row.pause.public(),
    }
