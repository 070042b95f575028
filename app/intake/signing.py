"""Request signatures: hex HMAC-SHA256(secret, timestamp "\\n" nonce "\\n" body)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import SecretStr

from app.dedup_keys import MAX_KEY_ID_LENGTH, intake_key
from app.errors import BadSignature

# A nonce is an opaque client token; bounded so the dedup key fits its column.
MAX_NONCE_LENGTH = 128


@dataclass(frozen=True, kw_only=True)
class Caller:
    """Who sent a request, and its nonce: together they are the dedup key, unambiguous
    because a key id never contains its separator (`app.dedup_keys`)."""

    key_id: str
    nonce: str

    @property
    def dedup_key(self) -> str:
        return intake_key(self.key_id, self.nonce)


def sign(secret: str, *, timestamp: str, nonce: str, body: bytes) -> str:
    """The signature a client sends in `X-Signature`."""
    message = timestamp.encode() + b"\n" + nonce.encode() + b"\n" + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify(
    headers: Mapping[str, str],
    body: bytes,
    *,
    keys: Mapping[str, SecretStr],
    now_s: float,
    window_s: int,
) -> Caller:
    """Check the signature headers. Raises `BadSignature` (one message for every cause a
    client cannot fix by itself, so it learns nothing about our keys)."""
    key_id = headers.get("x-key-id", "")
    timestamp = headers.get("x-timestamp", "")
    nonce = headers.get("x-nonce", "")
    signature = headers.get("x-signature", "")
    if not (key_id and timestamp and nonce and signature):
        raise BadSignature("missing X-Key-Id, X-Timestamp, X-Nonce or X-Signature")
    if len(nonce) > MAX_NONCE_LENGTH or len(key_id) > MAX_KEY_ID_LENGTH:
        raise BadSignature("X-Nonce or X-Key-Id is too long")
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
        raise BadSignature("X-Timestamp must be unix seconds")
    sent_s = int(timestamp)
    if abs(now_s - sent_s) > window_s:
        raise BadSignature(f"X-Timestamp is outside the allowed window of {window_s} s")
    secret = keys.get(key_id)
    expected = sign(
        secret.get_secret_value() if secret else "", timestamp=timestamp, nonce=nonce, body=body
    )
    given = signature.lower().encode("utf-8", "replace")
    if secret is None or not hmac.compare_digest(expected.encode(), given):
        raise BadSignature("signature does not match")
    return Caller(key_id=key_id, nonce=nonce)
