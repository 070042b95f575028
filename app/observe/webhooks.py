"""Alert webhooks (DESIGN §11): the request each kind of chat webhook expects."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import urllib.parse
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from app.settings import WebhookKind, WebhookSettings


class Event(StrEnum):
    """Alert events (DESIGN §11)."""

    QUEUE_FULL = "QUEUE_FULL"
    CALLER_RUNS = "CALLER_RUNS"
    TASK_DEAD = "TASK_DEAD"
    NO_CONSUMER = "NO_CONSUMER"
    BACKLOG = "BACKLOG"
    BROKER_DOWN = "BROKER_DOWN"
    JOURNAL_DOWN = "JOURNAL_DOWN"
    BEAT_TAKEOVER = "BEAT_TAKEOVER"
    RECOVERED = "RECOVERED"
    REPLAY_FINISHED = "REPLAY_FINISHED"


@dataclass(frozen=True, kw_only=True)
class AlertEvent:
    """One alert as it is logged and sent; `count` is how many events it stands for."""

    event: Event
    line: str | None
    time: datetime
    count: int
    message: str
    details: dict[str, Any]

    def body(self) -> dict[str, Any]:
        return {
            "event": self.event.value,
            "line": self.line,
            "time": self.time.isoformat(),
            "count": self.count,
            "message": self.message,
            "details": self.details,
        }

    def text(self) -> str:
        where = f" [{self.line}]" if self.line else ""
        folded = f" (x{self.count})" if self.count > 1 else ""
        return f"{self.event.value}{where}{folded}: {self.message}"


@dataclass(frozen=True, kw_only=True)
class WebhookRequest:
    url: str
    content: bytes
    headers: dict[str, str]


def dingtalk_sign(secret: str, timestamp_ms: int) -> str:
    """DingTalk robot signature: base64(HMAC-SHA256(secret, "<timestamp>\\n<secret>"))."""
    message = f"{timestamp_ms}\n{secret}".encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def build_request(hook: WebhookSettings, alert: AlertEvent, *, now_ms: int) -> WebhookRequest:
    """The HTTP request that carries `alert` to `hook`."""
    secret = hook.secret.get_secret_value() if hook.secret else None
    headers = {"content-type": "application/json"}
    url = hook.url
    if hook.kind is WebhookKind.DINGTALK:
        body: dict[str, Any] = {
            "msgtype": "markdown",
            "markdown": {"title": alert.event.value, "text": _markdown(alert)},
        }
        if secret:
            query = urllib.parse.urlencode(
                {"timestamp": now_ms, "sign": dingtalk_sign(secret, now_ms)}
            )
            url = f"{url}{'&' if '?' in url else '?'}{query}"
    elif hook.kind is WebhookKind.SLACK:
        body = {"text": alert.text()}
    else:
        body = alert.body()
    content = json.dumps(body, default=str).encode()
    if hook.kind is WebhookKind.GENERIC and secret:
        headers["x-signature"] = hmac.new(secret.encode(), content, hashlib.sha256).hexdigest()
    return WebhookRequest(url=url, content=content, headers=headers)


def _markdown(alert: AlertEvent) -> str:
    lines = [f"### {alert.text()}", "", f"- time: {alert.time.isoformat()}"]
    lines += [f"- {key}: {value}" for key, value in alert.details.items()]
    return "\n".join(lines)
