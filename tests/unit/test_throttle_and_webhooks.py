from __future__ import annotations

import base64
import hashlib
import hmac
import json
import urllib.parse
from datetime import UTC, datetime

from pydantic import SecretStr

from app.config.redis import masked_url
from app.config.settings import WebhookKind, WebhookSettings
from app.delivery.sinks import redact_url
from app.telemetry.events import AlertEvent, Event
from app.telemetry.throttle import Throttle
from app.telemetry.webhooks import build_request, dingtalk_sign

ALERT = AlertEvent(
    event=Event.QUEUE_FULL,
    line="order",
    time=datetime(2026, 1, 1, tzinfo=UTC),
    count=4,
    message="queue 'order' is full",
    details={"depth": 100, "limit": 100},
)


def test_throttle_sends_the_first_event_of_a_window_and_folds_the_rest():
    throttle = Throttle(window_s=60)
    assert throttle.offer("k", "a", now_s=0) == 1
    assert [throttle.offer("k", x, now_s=t) for x, t in [("b", 1), ("c", 30), ("d", 59)]] == [
        None
    ] * 3
    assert throttle.offer("other", "z", now_s=2) == 1  # keys have their own windows
    assert throttle.due(now_s=59.9) == []
    assert throttle.offer("k", "e", now_s=61) == 4  # the 3 folded ones ride with it
    assert throttle.due(now_s=200) == []


def test_throttle_releases_a_closed_windows_folded_count():
    throttle = Throttle(window_s=10)
    throttle.offer("k", "a", now_s=0)
    throttle.offer("k", "b", now_s=1)
    throttle.offer("k", "c", now_s=2)
    assert throttle.due(now_s=10) == [("k", "c", 2)]
    assert throttle.due(now_s=30) == []
    assert throttle.offer("k", "d", now_s=15) is None  # the release opened a new window


def test_throttle_drains_what_open_windows_folded_for_a_process_that_goes_away():
    throttle = Throttle(window_s=60)
    for n in range(3):
        throttle.offer("a", n, now_s=n)
    throttle.offer("b", 0, now_s=0)
    assert throttle.drain() == [("a", 2, 2)]
    assert throttle.drain() == []
    assert throttle.offer("a", 3, now_s=3) == 1


def test_generic_webhook_posts_the_alert_and_signs_the_body():
    hook = WebhookSettings(kind=WebhookKind.GENERIC, url="http://h/x", secret=SecretStr("s"))
    request = build_request(hook, ALERT, now_ms=1)
    body = json.loads(request.content)
    assert body == {
        "event": "QUEUE_FULL",
        "line": "order",
        "time": "2026-01-01T00:00:00+00:00",
        "count": 4,
        "message": "queue 'order' is full",
        "details": {"depth": 100, "limit": 100},
    }
    assert (
        request.headers["x-signature"]
        == hmac.new(b"s", request.content, hashlib.sha256).hexdigest()
    )
    unsigned = build_request(
        WebhookSettings(kind=WebhookKind.GENERIC, url="http://h/x"), ALERT, now_ms=1
    )
    assert "x-signature" not in unsigned.headers


def test_dingtalk_webhook_carries_timestamp_and_sign_in_the_query():
    hook = WebhookSettings(
        kind=WebhookKind.DINGTALK,
        url="https://oapi.example/robot/send?access_token=abc",
        secret=SecretStr("SECxyz"),
    )
    request = build_request(hook, ALERT, now_ms=1_700_000_000_000)
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(request.url).query))
    assert query["access_token"] == "abc"
    assert query["timestamp"] == "1700000000000"
    digest = hmac.new(b"SECxyz", b"1700000000000\nSECxyz", hashlib.sha256).digest()
    assert (
        query["sign"]
        == base64.b64encode(digest).decode()
        == dingtalk_sign("SECxyz", 1_700_000_000_000)
    )
    body = json.loads(request.content)
    assert body["msgtype"] == "markdown"
    assert "QUEUE_FULL [order] (x4)" in body["markdown"]["text"]


def test_slack_webhook_posts_text():
    hook = WebhookSettings(kind=WebhookKind.SLACK, url="https://hooks.example/T/B/X")
    body = json.loads(build_request(hook, ALERT, now_ms=1).content)
    assert body == {"text": "QUEUE_FULL [order] (x4): queue 'order' is full"}


def test_urls_shown_in_errors_and_output_carry_no_secrets():
    assert redact_url("https://user:pw@host:8443/in?token=abc") == "https://host:8443/in"
    assert masked_url("redis://:s3cret@127.0.0.1:6379/0") == "redis://:***@127.0.0.1:6379/0"
    assert masked_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
