"""What the API shows of the journal's records and of the lines' state."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from app.delivery.outcomes import waiting_for
from app.journal.attempt_log import Attempt
from app.journal.models import Record
from app.observe.line_view import LineStatus
from app.telemetry.incidents import Incident, event_id
from app.telemetry.tracing import trace_id_of


def payload_bytes(record: Record) -> int:
    """The size of the record's payload, as compact JSON in UTF-8."""
    text = json.dumps(record.payload, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode())


def record_view(
    record: Record,
    history: Sequence[Attempt] | None = None,
    *,
    include_payload: bool = True,
    open_circuits: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """A record as `GET /v1/records…` shows it: times in ISO 8601 UTC, and its payload's
    size (`payload_bytes`). With `history` (the record's attempts, oldest first), it shows
    them as `attempt_history`; `attempts` stays their count. `trace_id`: the trace of the
    request that brought the record in, when it was traced. Without `include_payload`,
    the payload itself is left out (a list of many records is lighter without it)."""
    view: dict[str, Any] = {
        "id": record.id,
        "line": record.line,
        "business_no": record.business_no,
        "source": record.source.value,
        "dedup_key": record.dedup_key,
        "status": record.status.value,
        "attempts": record.attempts,
        "payload": record.payload,
        "payload_bytes": payload_bytes(record),
        "last_error": record.last_error,
        # `downstream` or `room` for a `failed` record that waits without spending an
        # attempt (its line's circuit open, its downstream's Retry-After, no room in time),
        # or whose line's circuit is open (`open_circuits`); None otherwise.
        "waiting_for": waiting_for(record, circuit_open=record.line in open_circuits),
        "created_at": record.created_at.isoformat(),
        "updated_at": record.updated_at.isoformat(),
        "finished_at": record.finished_at.isoformat() if record.finished_at else None,
        "next_attempt_at": record.next_attempt_at.isoformat() if record.next_attempt_at else None,
        # The trace the record was taken in under, when tracing was on (else None).
        "trace_id": trace_id_of(record.traceparent),
    }
    if not include_payload:
        del view["payload"]
    if history is not None:
        view["attempt_history"] = [attempt.public() for attempt in history]
    return view


def line_status_view(row: LineStatus) -> dict[str, object]:
    """A line's status as `GET /v1/lines` shows it."""
    return {
        "line": row.line,
        # Records on the queue (waiting, or held by a worker until it acks), what the bound
        # counts; and the messages waiting that carry them.
        "queue_depth": row.queue_depth,
        "queue_messages": row.queue_messages,
        "max_queue_length": row.max_queue_length,
        "overflow": row.overflow,
        "live_workers": row.live_workers,
        "stalled_workers": row.stalled_workers,
        "counts": row.counts,
        "oldest_unfinished_age_s": row.oldest_unfinished_age_s,
        "paused": row.paused,
        "pause": None if row.pause is None else row.pause.public(),
        # An HTTP-sink line's circuit breaker; None for another sink or with Redis down.
        "circuit": None if row.circuit is None else row.circuit.public(),
        # Records of one sender taken ahead of every sender past its own.
        "fair_share": row.fair_share,
        # The senders with records on the queue, busiest first (the first ten by name, the
        # rest as `other`): their records, and how many of those wait past the fair share
        # behind every other sender's. None with Redis down.
        "senders": None
        if row.senders is None
        else [
            {"sender": s.sender, "records": s.records, "past_fair_share": s.past_share}
            for s in row.senders
        ],
    }


# An alert's figures are its details but these (an error's text may quote a downstream's
# answer), and but strings longer than this.
_NOT_FIGURES = frozenset({"error"})
MAX_FIGURE_TEXT = 128


def alert_view(item: dict[str, Any] | Incident, *, now: datetime) -> dict[str, Any]:
    """An incident or a point event as `GET /v1/alerts` shows it: `id`, event, line,
    `state` (`open`, `resolved`, or `event` for a point event), `opened_at`, `updated_at`,
    `resolved_at`, `duration_s` (to `now` while open; None for an event), count, `reason`
    (and `message`, the same sentence), its `figures`, `dry_run`, and `time` (when it
    last changed)."""
    if isinstance(item, Incident):
        details = item.details
        changed = item.resolved_at or item.updated_at
        shown: dict[str, Any] = {
            "id": item.id,
            "event": item.event.value,
            "line": item.line,
            "state": "open" if item.is_open else "resolved",
            "opened_at": item.opened_at.isoformat(),
            "updated_at": item.updated_at.isoformat(),
            "resolved_at": item.resolved_at.isoformat() if item.resolved_at else None,
            "duration_s": item.duration_s(now=now),
            "time": changed.isoformat(),
            "count": item.count,
            "message": item.message,
        }
    else:
        raw = item.get("details")
        details = raw if isinstance(raw, dict) else {}
        shown = {
            "id": event_id(item),
            "event": item.get("event"),
            "line": item.get("line"),
            "state": "event",
            "opened_at": item.get("time"),
            "updated_at": item.get("time"),
            "resolved_at": None,
            "duration_s": None,
            "time": item.get("time"),
            "count": item.get("count"),
            "message": item.get("message"),
        }
    figures = {
        key: value
        for key, value in details.items()
        if key not in _NOT_FIGURES
        and (
            isinstance(value, bool | int | float)
            or (isinstance(value, str) and len(value) <= MAX_FIGURE_TEXT)
        )
    }
    return {
        **shown,
        "reason": shown["message"],
        "figures": figures,
        "dry_run": details.get("dry_run") is True,
    }
