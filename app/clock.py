"""The one place that reads the wall clock; everything else is handed `now`."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """`value` in UTC; a time without a zone is taken as UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
