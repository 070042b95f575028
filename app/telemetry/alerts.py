"""Raising alerts: one structured log line and a message to each webhook. Sending happens
on a background thread from a bounded buffer: raising an alert never blocks, never raises,
and a slow webhook (or a slow Redis) costs the caller nothing.

Two kinds of alert (`app.telemetry.incidents.CONDITIONS`):

- a condition (no live worker, a backlog, an open circuit, Redis or the journal away…) is
  an incident per (event, line), kept in Redis where every process sees it: the message
  goes out once, when it opens; raising it again while it is open only counts it. Raises
  are folded in memory (a count, the latest message and figures) and written at most once
  per `FLUSH_INTERVAL_S`, however many there are (the intake raises `QUEUE_FULL` once per
  record that did not fit), and the queued messages go out between two writes. The
  monitor resolves it (`settle`) once it has found the condition no longer true for
  `alert_window_seconds` (or half a monitor interval, if longer): a condition that comes
  and goes within that stays one incident; that sends one `RESOLVED` message. While Redis
  does not answer, the process holds the incidents it raised itself and stores them once
  Redis is back (at the sender's next wake-up, raised again or not).
- a point event (a record died, a replay finished…) is sent at most once per (event, line)
  per `alert_window_seconds`, with how many events were folded into it; the folded tail is
  sent when its window closes."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import httpx
import redis

from app.config.settings import Settings
from app.telemetry.counters import Counter, Telemetry
from app.telemetry.events import AlertEvent, Event
from app.telemetry.incidents import (
    CONDITIONS,
    BookFull,
    Incident,
    IncidentBook,
    Key,
    event_id,
    new_incident,
    touched,
)
from app.telemetry.logs import get_logger
from app.telemetry.throttle import Throttle
from app.telemetry.webhooks import build_request
from app.threads import LoopThread

log = get_logger(__name__)

# A webhook that has not answered within this is given up on for that message.
WEBHOOK_TIMEOUT_S = 5.0
# How often the sender writes the conditions raised and the monitor's verdicts to Redis,
# and looks for folded counts whose window has closed.
FLUSH_INTERVAL_S = 0.5
# How long the sender waits, idle, before trying again to store the incidents it held
# while Redis was away, after a try that failed.
HAND_OVER_RETRY_S = 2.0


# The log line's own fields: a detail of the same name is left out of it.
_LOG_FIELDS = frozenset({"event", "alert", "line", "count", "message"})


@dataclass
class _Touch:
    """A condition raised (`count` times) since the sender last wrote it to Redis."""

    count: int
    time: datetime
    message: str
    details: dict[str, Any]


def opening_alert(incident: Incident) -> AlertEvent:
    """The message an incident sends when it opens."""
    return AlertEvent(
        event=incident.event,
        line=incident.line,
        time=incident.opened_at,
        count=1,
        message=incident.message,
        details={**incident.details, "incident_id": incident.id},
    )


def resolved_alert(incident: Incident) -> AlertEvent:
    """The `RESOLVED` message of a resolved incident: its event, line and duration."""
    at = incident.resolved_at or incident.updated_at
    duration = incident.duration_s(now=at)
    where = f" on {incident.line!r}" if incident.line else ""
    return AlertEvent(
        event=Event.RESOLVED,
        line=incident.line,
        time=at,
        count=1,
        message=f"{incident.event.value}{where} resolved after {duration:.0f} s "
        f"(open since {incident.opened_at:%Y-%m-%dT%H:%M:%SZ}, raised {incident.count} times)",
        details={
            "incident": incident.event.value,
            "incident_id": incident.id,
            "opened_at": incident.opened_at.isoformat(),
            "resolved_at": at.isoformat(),
            "duration_s": duration,
            "raised": incident.count,
        },
    )


class Alerter:
    """Keeps the incidents, throttles the point events, logs and sends both, for one
    process."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], datetime],
        telemetry: Telemetry | None = None,
    ) -> None:
        self._hooks = list(settings.alert_webhooks)
        self._clock = clock
        self._telemetry = telemetry
        self._book = IncidentBook(telemetry.client) if telemetry is not None else None
        # An incident resolves only once its condition was quiet (neither raised nor judged
        # present) for this long: a condition hovering at its threshold stays one
        # incident, and one that is gone resolves about this long after. At least half a
        # monitor run, so the monitor's own raise of the run before never holds it open.
        self._quiet_s = max(settings.alert_window_seconds, settings.monitor_interval_seconds / 2)
        # An incident held while Redis was away and not raised for this long is forgotten:
        # the monitor would have resolved it by now had Redis known of it.
        self._held_for_s = max(
            settings.monitor_interval_seconds * 2,
            self._quiet_s + settings.monitor_interval_seconds,
        )
        self._throttle = Throttle(window_s=settings.alert_window_seconds)
        self._buffer: deque[AlertEvent] = deque()
        self._buffer_size = settings.alert_buffer_size
        self._dropped = 0
        self._lock = threading.Lock()
        # The sender: started by the first alert, woken by each queued message, and its
        # last step (on `close`) writes and sends what is left.
        self._sender = LoopThread(
            self._send_step, name="alerts", every_s=FLUSH_INTERVAL_S, final_step=True
        )
        # The sender's alone: its webhook client (made for the first message) and the
        # monotonic time of its next write to Redis.
        self._client: httpx.Client | None = None
        self._next_write = 0.0
        self._in_flight = 0
        # Conditions raised and verdicts given, waiting for the sender to write them.
        self._touches: dict[Key, _Touch] = {}
        self._settles: list[tuple[frozenset[Key], datetime]] = []
        # When the monitor last judged each condition present (its verdicts, this process).
        self._present_at: dict[Key, datetime] = {}
        self._working = 0
        # Incidents this process opened while Redis did not answer (the sender's alone),
        # and when (monotonic) an idle sender may next try to store them.
        self._held: dict[Key, Incident] = {}
        self._hand_over_at = 0.0

    def raise_event(self, event: Event, *, line: str | None, message: str, **details: Any) -> None:
        """Report `event`. Never raises, never waits on a webhook or on Redis."""
        try:
            now = self._clock()
            if self._telemetry is not None:
                self._telemetry.count(Counter.ALERTS, event=event.value, line=line or "")
            with self._lock:
                if event in CONDITIONS:
                    key = (event, line)
                    pending = self._touches.get(key)
                    count = 1 + (pending.count if pending else 0)
                    self._touches[key] = _Touch(
                        count=count, time=now, message=message, details=details
                    )
                    # Written at the sender's next flush: no wake-up per raise.
                    self._start()
                    return
                alert = AlertEvent(
                    event=event, line=line, time=now, count=1, message=message, details=details
                )
                count_now = self._throttle.offer((event, line), alert, now_s=time.monotonic())
                if count_now is not None:
                    self._emit(replace(alert, count=count_now))
        except Exception:
            log.exception("alert_failed", alert=str(event))

    def settle(self, *, judged: Iterable[Key], present: Iterable[Key]) -> None:
        """The monitor's verdict of one run: of the conditions it `judged`, those not
        `present` are no longer true, and their open incidents resolve once quiet (neither
        raised nor judged present) for `alert_window_seconds`. Never raises, never waits."""
        try:
            now = self._clock()
            present = frozenset(present)
            cleared = frozenset(judged) - present
            with self._lock:
                for key in present:
                    self._present_at[key] = now
                self._settles.append((cleared, now))
                self._start()
        except Exception:
            log.exception("alert_settle_failed")

    def _start(self) -> None:
        """Start the sender (unless it runs, or is closed). Holds the lock."""
        self._sender.start()

    def _emit(self, alert: AlertEvent) -> None:
        """Log `alert` and queue it for the webhooks. Holds the lock."""
        log.warning(
            "alert",
            alert=alert.event.value,
            line=alert.line,
            count=alert.count,
            message=alert.message,
            **{key: value for key, value in alert.details.items() if key not in _LOG_FIELDS},
        )
        if self._telemetry is not None and alert.event not in CONDITIONS | {Event.RESOLVED}:
            event = {
                "event": alert.event.value,
                "line": alert.line,
                "time": alert.time.isoformat(),
                "count": alert.count,
                "message": alert.message,
                "details": alert.details,
            }
            self._telemetry.note_alert({"id": event_id(event), **event})
        # Also without webhooks: it releases the folded counts of closed windows.
        self._start()
        if not self._hooks:
            return
        if len(self._buffer) >= self._buffer_size:
            self._buffer.popleft()
            self._dropped += 1
        self._buffer.append(alert)
        self._sender.wake()

    def _send_step(self) -> float:
        """The sender's step: write when due, then send the queued messages; returns the
        seconds until the next write. Closing, it writes at once and sends until nothing
        is left."""
        # Writes at most once per FLUSH_INTERVAL_S (and while closing), and sends the queued
        # messages in between: a flood of raises costs one write per interval, and never
        # holds back a message.
        while True:
            closing = self._sender.stopping
            if closing or time.monotonic() >= self._next_write:
                self._keep_pending()
                self._next_write = time.monotonic() + FLUSH_INTERVAL_S
            with self._lock:
                if not self._buffer:
                    if closing and (self._touches or self._settles):
                        continue
                    if closing:
                        # The last step: the webhook client goes with it, whenever it ends.
                        client, self._client = self._client, None
                        if client is not None:
                            client.close()
                    return max(0.0, self._next_write - time.monotonic())
                alert = self._buffer.popleft()
                dropped, self._dropped = self._dropped, 0
                self._in_flight += 1
            if dropped:
                alert = replace(alert, details={**alert.details, "dropped_alerts": dropped})
            try:
                if self._client is None:
                    self._client = httpx.Client(timeout=WEBHOOK_TIMEOUT_S, follow_redirects=False)
                self._send(self._client, alert)
            finally:
                with self._lock:
                    self._in_flight -= 1

    # The incidents: the sender's thread alone runs these.

    def _keep_pending(self) -> None:
        """Release the folded counts of closed windows, write the conditions raised, store
        the incidents held while Redis was away and resolve what the verdicts cleared."""
        with self._lock:
            for _key, last, count in self._throttle.due(now_s=time.monotonic()):
                self._emit(replace(last, count=count))
            touches, self._touches = self._touches, {}
            settles, self._settles = self._settles, []
            present_at = dict(self._present_at)
            if not (touches or settles or self._held):
                return
            self._working += 1
        alerts: list[AlertEvent] = []
        try:
            alerts = self._keep(touches, settles, present_at)
        except Exception:
            log.exception("incidents_failed")
        finally:
            with self._lock:
                try:
                    for alert in alerts:
                        self._emit(alert)
                except Exception:
                    log.exception("alert_emit_failed")
                self._working -= 1

    def _keep(
        self,
        touches: dict[Key, _Touch],
        settles: list[tuple[frozenset[Key], datetime]],
        present_at: dict[Key, datetime],
    ) -> list[AlertEvent]:
        """Write the conditions raised, then resolve what the verdicts cleared; returns the
        messages to send."""
        alerts = [alert for key, touch in touches.items() for alert in self._touch(key, touch)]
        self._hand_over(skip=touches.keys(), idle=not (touches or settles))
        for cleared, at in settles:
            alerts += self._resolve(cleared, at=at, present_at=present_at)
        return alerts

    def _hand_over(self, *, skip: Iterable[Key], idle: bool) -> None:
        """Store the incidents held while Redis was away (but those of `skip`, just
        written), so that the monitor can resolve them. An `idle` sender (nothing else to
        write) tries at most every `HAND_OVER_RETRY_S` while Redis does not answer."""
        if self._book is None or not self._held:
            return
        if idle and time.monotonic() < self._hand_over_at:
            return
        self._hand_over_at = time.monotonic() + HAND_OVER_RETRY_S
        for key in self._held.keys() - set(skip):
            held = self._held[key]
            try:
                self._book.touch(
                    key,
                    count=0,
                    message=held.message,
                    details=held.details,
                    now=held.updated_at,
                    held=held,
                )
            except (redis.RedisError, BookFull):
                return
            del self._held[key]

    def _touch(self, key: Key, touch: _Touch) -> list[AlertEvent]:
        held = self._held.get(key)
        if held is not None and (touch.time - held.updated_at).total_seconds() > self._held_for_s:
            del self._held[key]
            held = None
        if self._book is not None:
            try:
                incident, opened = self._book.touch(
                    key,
                    count=touch.count,
                    message=touch.message,
                    details=touch.details,
                    now=touch.time,
                    held=held,
                )
            except (redis.RedisError, BookFull) as exc:
                log.debug("incident_not_stored", incident=key[0].value, error=type(exc).__name__)
            else:
                self._held.pop(key, None)
                return [opening_alert(incident)] if opened and held is None else []
        if held is not None:
            self._held[key] = touched(
                held,
                count=touch.count,
                message=touch.message,
                details=touch.details,
                now=touch.time,
            )
            return []
        incident = new_incident(
            key, count=touch.count, message=touch.message, details=touch.details, now=touch.time
        )
        self._held[key] = incident
        return [opening_alert(incident)]

    def _resolve(
        self, cleared: frozenset[Key], *, at: datetime, present_at: dict[Key, datetime]
    ) -> list[AlertEvent]:
        quiet_since = at - timedelta(seconds=self._quiet_s)
        # Judged present within the quiet time: not quiet yet, whatever its last raise.
        cleared = frozenset(
            key for key in cleared if not present_at.get(key, quiet_since) > quiet_since
        )
        alerts = []
        for key in cleared & self._held.keys():
            incident = self._held[key]
            if incident.updated_at > quiet_since:
                continue
            resolved = replace(self._held.pop(key), resolved_at=at)
            if self._book is not None:
                try:
                    self._book.remember_resolved(resolved)
                except redis.RedisError as exc:
                    log.debug(
                        "incident_not_stored", incident=key[0].value, error=type(exc).__name__
                    )
            alerts.append(resolved_alert(resolved))
        if self._book is None or not cleared:
            return alerts
        try:
            for incident in self._book.open_incidents():
                if incident.key not in cleared or incident.updated_at > quiet_since:
                    continue
                gone = self._book.resolve(incident.key, now=at, quiet_since=quiet_since)
                if gone is not None:
                    alerts.append(resolved_alert(gone))
        except redis.RedisError as exc:
            log.debug("incidents_not_resolved", error=type(exc).__name__)
        return alerts

    def _send(self, client: httpx.Client, alert: AlertEvent) -> None:
        for hook in self._hooks:
            request = build_request(hook, alert, now_ms=int(time.time() * 1000))
            try:
                response = client.post(
                    request.url, content=request.content, headers=request.headers
                )
                if response.status_code >= 300:
                    log.warning(
                        "alert_webhook_refused", kind=hook.kind.value, status=response.status_code
                    )
            except Exception as exc:  # noqa: BLE001 - a webhook's failure is logged, never raised
                log.warning("alert_webhook_failed", kind=hook.kind.value, error=type(exc).__name__)

    def flush(self, *, timeout_s: float = 5.0) -> bool:
        """Wait (at most `timeout_s`) until every condition raised was written and every
        queued alert was handed to the webhooks."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                idle = not (self._touches or self._settles or self._working)
                if idle and not self._buffer and not self._in_flight:
                    return True
            time.sleep(0.02)
        return False

    def close(self, *, timeout_s: float = 2.0) -> None:
        """Write the conditions raised, send what is queued and what was folded into
        windows still open (bounded by `timeout_s`), then stop the sender."""
        with self._lock:
            for _key, last, count in self._throttle.drain():
                self._emit(replace(last, count=count))
        self._sender.stop(timeout_s=timeout_s)
