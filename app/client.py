"""A client for the intake: post one record, signed. Python's standard library only, so a
sending system can copy this file as it is.

    from client import send_record   # or: from app.client import send_record

    answer = send_record(
        "http://127.0.0.1:8000", "order", {"business_no": "ORD-1001", "amount": 42},
        key_id="shop-1", secret="its-secret-of-32-random-bytes-xx",
    )
    answer.status   # 202 (200 when the nonce was seen before)
    answer.body     # {"id": "…", "line": "order", "business_no": "ORD-1001", "status": "enqueued"}

A request carries `X-Key-Id`, `X-Timestamp` (unix seconds; the intake allows 300 s either
way), `X-Nonce` (any string of up to 128 characters, new for each record) and
`X-Signature`: the hex HMAC-SHA256, with the key's secret, of
`timestamp + "\\n" + nonce + "\\n" + body`, over the body's exact bytes. Sending the same
nonce with the same body again is safe: the intake answers 200 with the record it already
has, as it is now, and stores nothing new. So keep the nonce to send a record again after
a timeout or a 5xx; the same nonce with another body is refused (409)."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Seconds to wait for the intake's answer.
DEFAULT_TIMEOUT_S = 10.0


def signature(secret: str, *, timestamp: str, nonce: str, body: bytes) -> str:
    """The `X-Signature` of `body`: hex HMAC-SHA256(secret, timestamp "\\n" nonce "\\n" body)."""
    message = timestamp.encode() + b"\n" + nonce.encode() + b"\n" + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def new_nonce() -> str:
    """A fresh nonce: 32 random hex digits."""
    return secrets.token_hex(16)


def signed_headers(
    body: bytes,
    *,
    key_id: str,
    secret: str,
    nonce: str | None = None,
    timestamp: int | None = None,
) -> dict[str, str]:
    """The headers that sign `body`: a new nonce and the current time unless given."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    nonce = new_nonce() if nonce is None else nonce
    return {
        "Content-Type": "application/json",
        "X-Key-Id": key_id,
        "X-Timestamp": ts,
        "X-Nonce": nonce,
        "X-Signature": signature(secret, timestamp=ts, nonce=nonce, body=body),
    }


def encode(payload: Mapping[str, Any] | bytes | str) -> bytes:
    """The body to send: a mapping as compact JSON, text or bytes as they are (the
    signature covers these exact bytes)."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode()
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def signed_request(
    base_url: str,
    line: str,
    payload: Mapping[str, Any] | bytes | str,
    *,
    key_id: str | None,
    secret: str | None,
    nonce: str | None = None,
) -> urllib.request.Request:
    """`POST {base_url}/v1/{line}` with `payload` as its body, signed with the key
    (`key_id`, `secret`). Without a key the request is unsigned, which only an intake in
    dev mode takes; it still carries a nonce, so sending it again is safe there too.
    Raises `ValueError` for a URL that is not http or https."""
    body = encode(payload)
    if key_id is not None and secret is not None:
        headers = signed_headers(body, key_id=key_id, secret=secret, nonce=nonce)
    else:
        headers = {"Content-Type": "application/json", "X-Nonce": nonce or new_nonce()}
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"the intake's URL must begin with http:// or https://: {base_url!r}")
    url = f"{base_url.rstrip('/')}/v1/{urllib.parse.quote(line, safe='')}"
    # S310: the scheme is checked above (http or https only).
    return urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310


@dataclass(frozen=True, kw_only=True)
class Answer:
    """The intake's answer: its status code and its JSON body (None if it sent none)."""

    status: int
    body: Any
    nonce: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def error(self) -> str | None:
        """`code: message` of an error answer (`{"error": {"code", "message"}}`)."""
        detail = self.body.get("error") if isinstance(self.body, dict) else None
        if not isinstance(detail, dict):
            return None if self.ok else f"HTTP {self.status}"
        return f"{detail.get('code')}: {detail.get('message')}"


def send(request: urllib.request.Request, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Answer:
    """Send `request` and read the answer, an error answer included. Raises `OSError`
    (`urllib.error.URLError`, `TimeoutError`) when no answer came: send it again with the
    same nonce."""
    nonce = request.get_header("X-nonce") or ""
    try:
        # S310: `signed_request` built it, with an http or https URL.
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = raw.decode("utf-8", "replace")
    return Answer(status=status, body=body, nonce=nonce)


def send_record(
    base_url: str,
    line: str,
    payload: Mapping[str, Any] | bytes | str,
    *,
    key_id: str | None,
    secret: str | None,
    nonce: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Answer:
    """Post one record to the intake at `base_url` (e.g. `http://127.0.0.1:8000`), signed
    with the key (`key_id`, `secret`), and return its answer (`Answer.nonce` is the nonce
    sent). Raises `OSError` when the intake did not answer: to send the record again
    safely, choose its nonce yourself (`new_nonce()`) and send it again with the same one."""
    request = signed_request(base_url, line, payload, key_id=key_id, secret=secret, nonce=nonce)
    return send(request, timeout_s=timeout_s)
