"""Incidents: a condition alert (a line with no live worker, a backlog, an open circuit,
Redis or the journal away…) is one incident per (event, line), not a message per check.

An incident is opened once (the one process whose write creates it sends its webhook
message), updated while the condition lasts (`count`, `updated_at`, the latest message and
figures; no message), and resolved when the monitor finds the condition no longer true
(one `RESOLVED` message naming the event, the line and how long it lasted).

They live in Redis, where every process sees them: the open ones in one hash (a field per
(event, line), so at most one per condition event and line), the resolved ones in a list
trimmed to `RECENT_RESOLVED`. Writes are optimistic transactions on the hash (`WATCH`): two
processes that open the same incident at once make one incident and one message."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import redis

from app.errors import BrokerUnavailable
from app.ids import new_id
from app.observe.events import Event
from app.observe.telemetry import recent_alerts

OPEN_KEY = "pipeline:incidents:open"
RESOLVED_KEY = "pipeline:incidents:resolved"
# How many resolved incidents `/v1/alerts` can show.
RECENT_RESOLVED = 50
# At most this many open incidents: there is one per condition event and line, so a
# registry of lines stays far below it; past it a new one is held by the process alone.
MAX_OPEN = 1000
# How often an optimistic write is tried again when another process wrote meanwhile.
WRITE_TRIES = 8

# The events that are conditions (true for a while, then not): incidents. Every other
# event is a point event (a record died, a replay finished), folded per window.
CONDITIONS = frozenset(
    {
        Event.NO_CONSUMER,
        Event.BACKLOG,
        Event.QUEUE_FULL,
        Event.DOWNSTREAM_DOWN,
        Event.WORKER_STALLED,
        Event.BROKER_DOWN,
        Event.JOURNAL_DOWN,
    }
)

Key = tuple[Event, str | None]


def field_of(key: Key) -> str:
    event, line = key
    return f"{event.value}|{line or ''}"


@dataclass(frozen=True, kw_only=True)
class Incident:
    """One condition's incident; `count` is how many times it was raised or seen."""

    id: str
    event: Event
    line: str | None
    opened_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    count: int
    message: str
    details: dict[str, Any]

    @property
    def key(self) -> Key:
        return (self.event, self.line)

    @property
    def is_open(self) -> bool:
        return self.resolved_at is None

    def duration_s(self, *, now: datetime) -> float:
        """How long it lasted, or has lasted until `now` while open."""
        end = self.resolved_at or now
        return round(max(0.0, (end - self.opened_at).total_seconds()), 1)

    def to_json(self) -> str:
        return json.dumps(
            {
                "id": self.id,
                "event": self.event.value,
                "line": self.line,
                "opened_at": self.opened_at.isoformat(),
                "updated_at": self.updated_at.isoformat(),
                "resolved_at": self.resolved_at.isoformat() if self.resolved_at else None,
                "count": self.count,
                "message": self.message,
                "details": self.details,
            },
            default=str,
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> Incident | None:
        """The incident `to_json` wrote; None for anything else."""
        try:
            data = json.loads(raw)
            resolved = data.get("resolved_at")
            details = data.get("details")
            return cls(
                id=str(data["id"]),
                event=Event(data["event"]),
                line=data.get("line"),
                opened_at=datetime.fromisoformat(data["opened_at"]),
                updated_at=datetime.fromisoformat(data["updated_at"]),
                resolved_at=datetime.fromisoformat(resolved) if resolved else None,
                count=int(data["count"]),
                message=str(data.get("message") or ""),
                details=details if isinstance(details, dict) else {},
            )
        except (ValueError, KeyError, TypeError):
            return None


def new_incident(
    key: Key, *, count: int, message: str, details: dict[str, Any], now: datetime
) -> Incident:
    event, line = key
    return Incident(
        id=f"inc_{new_id(now)}",
        event=event,
        line=line,
        opened_at=now,
        updated_at=now,
        resolved_at=None,
        count=count,
        message=message,
        details=details,
    )


def touched(
    incident: Incident, *, count: int, message: str, details: dict[str, Any], now: datetime
) -> Incident:
    """`incident` seen `count` more times, last at `now`, with the latest message."""
    return replace(
        incident,
        updated_at=max(now, incident.updated_at),
        count=incident.count + count,
        message=message,
        details=details,
    )


class BookFull(Exception):
    """`MAX_OPEN` incidents are open: a new one is not stored."""


@dataclass(frozen=True)
class IncidentBook:
    """The incidents in Redis. Every method raises `redis.RedisError` when Redis does not
    answer."""

    client: redis.Redis

    def touch(
        self,
        key: Key,
        *,
        count: int,
        message: str,
        details: dict[str, Any],
        now: datetime,
        held: Incident | None = None,
    ) -> tuple[Incident, bool]:
        """Open the incident of `key`, or update it when open; returns it and whether this
        call opened it. `held`: the incident this process opened while Redis was away,
        stored as it is (with this touch) when Redis has none. Raises `BookFull`."""
        field = field_of(key)
        for _ in range(WRITE_TRIES):
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(OPEN_KEY)  # type: ignore[no-untyped-call]
                    raw = pipe.hget(OPEN_KEY, field)
                    current = Incident.from_json(raw) if raw is not None else None
                    if current is None and pipe.hlen(OPEN_KEY) >= MAX_OPEN:
                        raise BookFull(field)
                    base = current or held
                    if base is None:
                        incident = new_incident(
                            key, count=count, message=message, details=details, now=now
                        )
                    else:
                        incident = touched(
                            base, count=count, message=message, details=details, now=now
                        )
                    pipe.multi()
                    pipe.hset(OPEN_KEY, field, incident.to_json())
                    pipe.execute()
                except redis.WatchError:
                    continue
                return incident, current is None
        raise redis.RedisError(f"incident {field} kept changing under the write")

    def open_incidents(self) -> list[Incident]:
        raw = self.client.hvals(OPEN_KEY)
        found = (Incident.from_json(item) for item in raw)
        return [incident for incident in found if incident is not None]

    def resolve(self, key: Key, *, now: datetime, quiet_since: datetime) -> Incident | None:
        """Resolve the open incident of `key` unless it was raised after `quiet_since`;
        returns it resolved, or None when there was none to resolve (another process
        resolved it, or it was raised meanwhile)."""
        field = field_of(key)
        for _ in range(WRITE_TRIES):
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(OPEN_KEY)  # type: ignore[no-untyped-call]
                    raw = pipe.hget(OPEN_KEY, field)
                    current = Incident.from_json(raw) if raw is not None else None
                    if current is None or current.updated_at > quiet_since:
                        pipe.unwatch()
                        return None
                    resolved = replace(current, resolved_at=now)
                    pipe.multi()
                    pipe.hdel(OPEN_KEY, field)
                    pipe.lpush(RESOLVED_KEY, resolved.to_json())
                    pipe.ltrim(RESOLVED_KEY, 0, RECENT_RESOLVED - 1)
                    pipe.execute()
                except redis.WatchError:
                    continue
                return resolved
        return None

    def remember_resolved(self, incident: Incident) -> None:
        """Keep `incident` (resolved by a process that held it alone) in the history."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.lpush(RESOLVED_KEY, incident.to_json())
            pipe.ltrim(RESOLVED_KEY, 0, RECENT_RESOLVED - 1)
            pipe.execute()

    def resolved(self, *, limit: int = RECENT_RESOLVED) -> list[Incident]:
        """The resolved incidents, newest first."""
        raw = self.client.lrange(RESOLVED_KEY, 0, limit - 1)
        found = (Incident.from_json(item) for item in raw)
        return [incident for incident in found if incident is not None]


def event_id(alert: dict[str, Any]) -> str:
    """A point event's id: the one it was kept with, else one drawn from its content."""
    given = alert.get("id")
    if isinstance(given, str) and given:
        return given
    text = json.dumps(alert, sort_keys=True, default=str).encode()
    return "evt_" + hashlib.sha256(text).hexdigest()[:26]


def history(client: redis.Redis) -> list[Incident | dict[str, Any]]:
    """What `/v1/alerts` shows: the open incidents, the resolved ones and the point events
    (`app.observe.telemetry.recent_alerts`), unordered. Raises `BrokerUnavailable`."""
    book = IncidentBook(client)
    try:
        incidents: list[Incident | dict[str, Any]] = [*book.open_incidents(), *book.resolved()]
    except redis.RedisError as exc:
        raise BrokerUnavailable(f"incidents unavailable: {exc}") from exc
    return [*incidents, *recent_alerts(client)]
