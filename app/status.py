"""Per-line status: queue depth and bound, policy, journal counts, oldest unfinished age."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.errors import BrokerUnavailable
from app.journal import store
from app.runtime import Runtime


@dataclass(frozen=True, kw_only=True)
class LineStatus:
    """One line's row of `pipeline status` and `/v1/lines`."""

    line: str
    queue_depth: int | None
    max_queue_length: int
    overflow: str
    counts: dict[str, int]
    oldest_unfinished_age_s: float | None


def line_statuses(rt: Runtime, *, now: datetime) -> list[LineStatus]:
    """Every line's status. Depth is None when Redis does not answer.

    Raises `sqlalchemy.exc.SQLAlchemyError` when the journal does not answer."""
    with rt.engine.connect() as conn:
        counts = store.counts_by_status(conn)
        oldest = {line.name: store.oldest_unfinished(conn, line=line.name) for line in rt.lines}
    rows = []
    for line in rt.lines:
        try:
            depth: int | None = rt.admission.depth(line.queue)
        except BrokerUnavailable:
            depth = None
        started = oldest[line.name]
        rows.append(
            LineStatus(
                line=line.name,
                queue_depth=depth,
                max_queue_length=line.settings.max_queue_length,
                overflow=line.settings.overflow.value,
                counts=counts.get(line.name, {}),
                oldest_unfinished_age_s=(now - started).total_seconds() if started else None,
            )
        )
    return rows
