"""Raising alerts: one structured log line and a message to each webhook,
throttled per (event, line). Sending happens on a background thread from a bounded buffer:
raising an alert never blocks, never raises, and a slow webhook costs the caller nothing."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx

from app.logs import get_logger
from app.observe.events import AlertEvent, Event
from app.observe.telemetry import Counter, Telemetry
from app.observe.throttle import Throttle
from app.observe.webhooks import build_request
from app.settings import Settings

log = get_logger(__name__)

# A webhook that has not answered within this is given up on for that message.
WEBHOOK_TIMEOUT_S = 5.0
# How often the sender looks for folded counts whose window has closed.
FLUSH_INTERVAL_S = 0.5


class Alerter:
    """Throttles, logs and sends alerts of one process."""

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
        self._throttle = Throttle(window_s=settings.alert_window_seconds)
        self._buffer: deque[AlertEvent] = deque()
        self._buffer_size = settings.alert_buffer_size
        self._dropped = 0
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closing = False
        self._in_flight = 0

    def raise_event(self, event: Event, *, line: str | None, message: str, **details: Any) -> None:
        """Report `event`. Never raises, never waits on a webhook."""
        try:
            now = self._clock()
            alert = AlertEvent(
                event=event, line=line, time=now, count=1, message=message, details=details
            )
            if self._telemetry is not None:
                self._telemetry.count(Counter.ALERTS, event=event.value, line=line or "")
            with self._lock:
                count = self._throttle.offer((event, line), alert, now_s=time.monotonic())
                if count is not None:
                    self._emit(AlertEvent(**{**alert.__dict__, "count": count}))
        except Exception:
            log.exception("alert_failed", alert=str(event))

    def _emit(self, alert: AlertEvent) -> None:
        """Log `alert` and queue it for the webhooks. Holds the lock."""
        log.warning(
            "alert",
            alert=alert.event.value,
            line=alert.line,
            count=alert.count,
            message=alert.message,
            **alert.details,
        )
        if self._telemetry is not None:
            self._telemetry.note_alert(
                {
                    "event": alert.event.value,
                    "line": alert.line,
                    "time": alert.time.isoformat(),
                    "count": alert.count,
                    "message": alert.message,
                    "details": alert.details,
                }
            )
        if self._thread is None:
            # Also without webhooks: it releases the folded counts of closed windows.
            self._thread = threading.Thread(target=self._run, name="alerts", daemon=True)
            self._thread.start()
        if not self._hooks:
            return
        if len(self._buffer) >= self._buffer_size:
            self._buffer.popleft()
            self._dropped += 1
        self._buffer.append(alert)
        self._wake.notify()

    def _run(self) -> None:
        with httpx.Client(timeout=WEBHOOK_TIMEOUT_S, follow_redirects=False) as client:
            while True:
                with self._lock:
                    for _key, last, count in self._throttle.due(now_s=time.monotonic()):
                        self._emit(AlertEvent(**{**last.__dict__, "count": count}))
                    if not self._buffer:
                        if self._closing:
                            return
                        self._wake.wait(timeout=FLUSH_INTERVAL_S)
                        continue
                    alert = self._buffer.popleft()
                    dropped, self._dropped = self._dropped, 0
                    self._in_flight += 1
                if dropped:
                    alert = AlertEvent(
                        **{
                            **alert.__dict__,
                            "details": {**alert.details, "dropped_alerts": dropped},
                        }
                    )
                try:
                    self._send(client, alert)
                finally:
                    with self._lock:
                        self._in_flight -= 1

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
        """Wait (at most `timeout_s`) until every queued alert was handed to the webhooks."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._buffer and not self._in_flight:
                    return True
            time.sleep(0.02)
        return False

    def close(self, *, timeout_s: float = 2.0) -> None:
        """Send what is queued and what was folded into windows still open (bounded by
        `timeout_s`), then stop the sender."""
        with self._lock:
            for _key, last, count in self._throttle.drain():
                self._emit(AlertEvent(**{**last.__dict__, "count": count}))
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
