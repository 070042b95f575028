"""Alert webhooks: the request each kind of chat webhook expects."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

from app.config.settings import WebhookKind, WebhookSettings
from app.telemetry.events import AlertEvent


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
