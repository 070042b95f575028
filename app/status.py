"""Per-line status: queue depth and bound, policy, journal counts, oldest unfinished age."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.errors import BrokerUnavailable
from app.journal import store
from app.liveness import live_workers
from app.runtime import Runtime


@dataclass(frozen=True, kw_only=True)
class LineStatus:
    """One line's row of `pipeline status` and `/v1/lines`."""

    line: str
    queue_depth: int | None
    max_queue_length: int
    overflow: str
    live_workers: int | None
    counts: dict[str, int]
    oldest_unfinished_age_s: float | None


def line_statuses(rt: Runtime, *, now: datetime) -> list[LineStatus]:
    """Every line's status. Depth and live workers are None when Redis does not answer.

    Raises `sqlalchemy.exc.SQLAlchemyError` when the journal does not answer."""
    with rt.engine.connect() as conn:
        counts = store.counts_by_status(conn)
        oldest = {line.name: store.oldest_unfinished(conn, line=line.name) for line in rt.lines}
    rows = []
    for line in rt.lines:
        try:
            depth: int | None = rt.admission.depth(line.queue)
            live: int | None = len(live_workers(rt.redis, line.name))
        except BrokerUnavailable:
            depth = live = None
        started = oldest[line.name]
        rows.append(
            LineStatus(
                line=line.name,
                queue_depth=depth,
                max_queue_length=line.settings.max_queue_length,
                overflow=line.settings.overflow.value,
                live_workers=live,
                counts=counts.get(line.name, {}),
                oldest_unfinished_age_s=(now - started).total_seconds() if started else None,
            )
        )
    return rows


def public(row: LineStatus) -> dict[str, object]:
    """A line's status as `GET /v1/lines` shows it."""
    return {
        "line": row.line,
        "queue_depth": row.queue_depth,
        "max_queue_length": row.max_queue_length,
        "overflow": row.overflow,
        "live_workers": row.live_workers,
        "counts": row.counts,
        "oldest_unfinished_age_s": row.oldest_unfinished_age_s,
    }
