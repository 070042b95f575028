"""A paused line: what the monitor calls for."""

from __future__ import annotations

from datetime import UTC, datetime

from app.admission.pause import LinePause
from app.observe.line_view import LineStatus
from app.observe.monitor import check_line

PAUSE = LinePause(
    line="order", paused_at=datetime(2026, 1, 1, tzinfo=UTC), actor="alice", reason=None
)


def _row(**overrides) -> LineStatus:
    values = {
        "line": "order",
        "queue_depth": 0,
        "max_queue_length": 10,
        "overflow": "defer",
        "live_workers": 0,
        "counts": {"deferred": 40},
        "oldest_unfinished_age_s": 3600.0,
    }
    return LineStatus(**(values | overrides))


def test_a_paused_line_calls_for_neither_no_consumer_nor_backlog():
    assert check_line(_row(pause=PAUSE), backlog_after_s=60) == []


def test_the_same_line_running_calls_for_both():
    found = check_line(_row(), backlog_after_s=60)
    assert {f.event.value for f in found} == {"NO_CONSUMER", "BACKLOG"}
