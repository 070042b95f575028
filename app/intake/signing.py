"""Request signatures: hex HMAC-SHA256(secret, timestamp "\\n" nonce "\\n" body)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import SecretStr

from app.client import signature
from app.dedup_keys import MAX_KEY_ID_LENGTH, intake_key
from app.errors import BadSignature

# A nonce is an opaque client token; bounded so the dedup key fits its column.
MAX_NONCE_LENGTH = 128
# The headers of a signed request, as a client names them.
HEADERS = ("X-Key-Id", "X-Timestamp", "X-Nonce", "X-Signature")


@dataclass(frozen=True, kw_only=True)
class Caller:
    """Who sent a request, and its nonce: together they are the dedup key, unambiguous
    because a key id never contains its separator (`app.dedup_keys`)."""

    key_id: str
    nonce: str

    @property
    def dedup_key(self) -> str:
        return intake_key(self.key_id, self.nonce)


def missing_headers(headers: Mapping[str, str]) -> list[str]:
    """The signature headers absent (or empty) from `headers`, by name, in order."""
    return [name for name in HEADERS if not headers.get(name.lower(), "")]


def sign(secret: str, *, timestamp: str, nonce: str, body: bytes) -> str:
    """The signature a client sends in `X-Signature`: the one the client module makes."""
    return signature(secret, timestamp=timestamp, nonce=nonce, body=body)


def verify(
    headers: Mapping[str, str],
    body: bytes,
    *,
    keys: Mapping[str, SecretStr],
    now_s: float,
    window_s: int,
) -> Caller:
    """Check the signature headers. Raises `BadSignature` naming the header that is
    missing or the check that failed; an unknown key id and a wrong signature get one
    message, so a caller learns nothing about our keys."""
    key_id, timestamp, nonce, signature = (headers.get(name.lower(), "") for name in HEADERS)
    missing = missing_headers(headers)
    if missing:
        raise BadSignature(f"missing header{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    if len(nonce) > MAX_NONCE_LENGTH:
        raise BadSignature(f"X-Nonce is longer than {MAX_NONCE_LENGTH} characters")
    if len(key_id) > MAX_KEY_ID_LENGTH:
        raise BadSignature(f"X-Key-Id is longer than {MAX_KEY_ID_LENGTH} characters")
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
        raise BadSignature("X-Timestamp must be unix seconds (an integer, e.g. from date +%s)")
    sent_s = int(timestamp)
    if abs(now_s - sent_s) > window_s:
        raise BadSignature(
            f"X-Timestamp is {sent_s - int(now_s):+d} s from this server's clock; "
            f"the allowed window is {window_s} s either way"
        )
    secret = keys.get(key_id)
    expected = sign(
        secret.get_secret_value() if secret else "", timestamp=timestamp, nonce=nonce, body=body
    )
    given = signature.lower().encode("utf-8", "replace")
    if secret is None or not hmac.compare_digest(expected.encode(), given):
        # One answer for an unknown key id and a wrong signature: a caller learns nothing
        # of which key ids exist.
        raise BadSignature(
            "X-Signature does not match: it must be the hex HMAC-SHA256, with the secret of "
            'the key named by X-Key-Id, of X-Timestamp + "\\n" + X-Nonce + "\\n" + the raw body'
        )
    return Caller(key_id=key_id, nonce=nonce)
