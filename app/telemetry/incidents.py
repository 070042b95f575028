"""Incidents: a condition alert (a line with no live worker, a backlog, an open circuit,
Redis or the journal away…) is one incident per (event, line), not a message per check.

An incident is opened once (the one process whose write creates it sends its webhook
message), updated while the condition lasts (`count`, `updated_at`, the latest message and
figures; no message), and resolved when the monitor finds the condition no longer true
(one `RESOLVED` message naming the event, the line and how long it lasted).

They live in Redis, where every process sees them: the open ones in one hash (a field per
(event, line), so at most one per condition event and line), the resolved ones in a list
trimmed to `RECENT_RESOLVED`. Each write is one Lua script on one field (`TOUCH` opens or
updates it, `RESOLVE` moves it to the history only if it is still as it was read): two
processes that open the same incident at once make one incident and one message, and
processes writing at once never make each other try again."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import redis

from app.errors import BrokerUnavailable
from app.ids import new_id
from app.telemetry.counters import recent_alerts
from app.telemetry.events import Event

OPEN_KEY = "pipeline:incidents:open"
RESOLVED_KEY = "pipeline:incidents:resolved"
# How many resolved incidents `/v1/alerts` can show.
RECENT_RESOLVED = 50
# At most this many open incidents: there is one per condition event and line, so a
# registry of lines stays far below it; past it a new one is held by the process alone.
MAX_OPEN = 1000

# KEYS[1]: the open hash. ARGV[1]: the field; ARGV[2]: `MAX_OPEN`; ARGV[3]: the incident to
# store when the field has none (a new one, or one held while Redis was away); ARGV[4]:
# the count to add; ARGV[5]: the time of the touch (`stamp`); ARGV[6], ARGV[7]: the latest
# message and figures, each as JSON. Returns {1, stored} when it opened the incident, {0,
# stored} when it updated it, {-1} when the hash is full. An update keeps the stored
# incident's identity (id, opening time), adds the count, keeps the later of the two times
# (`stamp` sorts as text) and takes the latest message and figures, as given: only the
# incident's plain fields go through cjson.
TOUCH = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
local ok, incident = false, nil
if current then ok, incident = pcall(cjson.decode, current) end
if not ok or type(incident) ~= 'table' then
    if not current and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[2]) then return {-1} end
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
    return {1, ARGV[3]}
end
incident.count = (tonumber(incident.count) or 0) + tonumber(ARGV[4])
if type(incident.updated_at) ~= 'string' or ARGV[5] > incident.updated_at then
    incident.updated_at = ARGV[5]
end
incident.message = nil
incident.details = nil
local head = cjson.encode(incident)
local stored = string.sub(head, 1, -2) .. ',"message":' .. ARGV[6] .. ',"details":' ..
    ARGV[7] .. '}'
redis.call('HSET', KEYS[1], ARGV[1], stored)
return {0, stored}
"""

# KEYS[1]: the open hash, KEYS[2]: the resolved list. ARGV[1]: the field; ARGV[2]: its
# incident as read; ARGV[3]: that incident resolved; ARGV[4]: `RECENT_RESOLVED`. Moves it
# to the history only if it is unchanged (not raised since it was read); returns 1 if so.
RESOLVE = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('LPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[4]) - 1)
return 1
"""

# The events that are conditions (true for a while, then not): incidents. Every other
# event is a point event (a record died, a replay finished), folded per window.
CONDITIONS = frozenset(
    {
        Event.NO_CONSUMER,
        Event.BACKLOG,
        Event.QUEUE_FULL,
        Event.DOWNSTREAM_DOWN,
        Event.WORKER_STALLED,
        Event.HANDLER_STUCK,
        Event.BROKER_DOWN,
        Event.JOURNAL_DOWN,
    }
)

Key = tuple[Event, str | None]


def field_of(key: Key) -> str:
    event, line = key
    return f"{event.value}|{line or ''}"


def stamp(at: datetime) -> str:
    """`at` as stored: ISO 8601 in UTC with microseconds, so that two stamps sort as text
    in the order of their times."""
    if at.tzinfo is not None:
        at = at.astimezone(UTC)
    return at.isoformat(timespec="microseconds")


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
                "opened_at": stamp(self.opened_at),
                "updated_at": stamp(self.updated_at),
                "resolved_at": stamp(self.resolved_at) if self.resolved_at else None,
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
    _touch: Any = field(init=False, repr=False, compare=False)
    _resolve: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Registering computes the scripts' digests; it does not talk to Redis.
        object.__setattr__(self, "_touch", self.client.register_script(TOUCH))
        object.__setattr__(self, "_resolve", self.client.register_script(RESOLVE))

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
        """Open the incident of `key`, or update it when open (one script: atomic, and
        never in conflict with another process's write); returns it and whether this call
        opened it. `held`: the incident this process opened while Redis was away, stored
        as it is (with this touch) when Redis has none. Raises `BookFull`."""
        if held is None:
            fresh = new_incident(key, count=count, message=message, details=details, now=now)
        else:
            fresh = touched(held, count=count, message=message, details=details, now=now)
        as_json = fresh.to_json()
        answer = self._touch(
            keys=[OPEN_KEY],
            args=[
                field_of(key),
                MAX_OPEN,
                as_json,
                count,
                stamp(now),
                json.dumps(message),
                json.dumps(details, default=str),
            ],
        )
        opened = int(answer[0])
        if opened < 0:
            raise BookFull(field_of(key))
        stored = Incident.from_json(answer[1]) if len(answer) > 1 else None
        if stored is None:  # not read back as written: what this call meant to store
            stored = fresh
        return stored, opened == 1

    def open_incidents(self) -> list[Incident]:
        raw = self.client.hvals(OPEN_KEY)
        found = (Incident.from_json(item) for item in raw)
        return [incident for incident in found if incident is not None]

    def resolve(self, key: Key, *, now: datetime, quiet_since: datetime) -> Incident | None:
        """Resolve the open incident of `key` unless it was raised after `quiet_since`;
        returns it resolved, or None when there was none to resolve (another process
        resolved it, or it was raised meanwhile: the next verdict judges it again)."""
        field_name = field_of(key)
        raw = self.client.hget(OPEN_KEY, field_name)
        current = Incident.from_json(raw) if raw is not None else None
        if current is None or current.updated_at > quiet_since:
            return None
        resolved = replace(current, resolved_at=now)
        moved = self._resolve(
            keys=[OPEN_KEY, RESOLVED_KEY],
            args=[field_name, raw, resolved.to_json(), RECENT_RESOLVED],
        )
        return resolved if int(moved) == 1 else None

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
    (`app.telemetry.counters.recent_alerts`), unordered. Raises `BrokerUnavailable`."""
    book = IncidentBook(client)
    try:
        incidents: list[Incident | dict[str, Any]] = [*book.open_incidents(), *book.resolved()]
    except redis.RedisError as exc:
        raise BrokerUnavailable(f"incidents unavailable: {exc}") from exc
    return [*incidents, *recent_alerts(client)]
