"""Request signatures, in the scheme each source's key names (`IntakeKeyKind`):

- the pipeline's own: `X-Key-Id`, `X-Timestamp`, `X-Nonce` and `X-Signature`, the hex
  HMAC-SHA256(secret, timestamp "\\n" nonce "\\n" body);
- Standard Webhooks (`app.standard_webhooks`): `webhook-id` (the nonce), `webhook-timestamp`
  and `webhook-signature`. Such a request names no key id: its source is the one whose key
  made one of its signatures, or the one `X-Key-Id` names when it carries one.

A request carrying any of the `webhook-` headers is checked as Standard Webhooks; any
other as the pipeline's own."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from app import standard_webhooks
from app.client import signature
from app.config.credentials import IntakeKey, IntakeKeyKind
from app.errors import BadSignature
from app.ids import MAX_KEY_ID_LENGTH, intake_key

# A nonce is an opaque client token; bounded so the dedup key fits its column.
MAX_NONCE_LENGTH = 128
# The headers of a signed request, as a client names them.
HEADERS = ("X-Key-Id", "X-Timestamp", "X-Nonce", "X-Signature")
# A timestamp longer than this is no time of this era (and too large to compare cheaply).
_MAX_TIMESTAMP_DIGITS = 12
# One answer for every request no key matched, whatever the reason: a caller learns nothing
# of which key ids exist.
_NO_MATCH = (
    "X-Signature does not match: it must be the hex HMAC-SHA256, with the secret of "
    'the key named by X-Key-Id, of X-Timestamp + "\\n" + X-Nonce + "\\n" + the raw body'
)
_NO_MATCH_STANDARD_WEBHOOKS = (
    "webhook-signature does not match: one of its v1 entries must be the base64 "
    "HMAC-SHA256, with the source's key (the base64 after whsec_, decoded), of "
    'webhook-id + "." + webhook-timestamp + "." + the raw body'
)

# The key an unknown source's check is made with, so that it takes as long as a known one's.
_NO_KEY = bytes(standard_webhooks.MIN_KEY_BYTES)


@dataclass(frozen=True, kw_only=True)
class Caller:
    """Who sent a request, and its nonce: together they are the dedup key, unambiguous
    because a key id never contains its separator (`app.ids`)."""

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
    keys: Mapping[str, IntakeKey],
    now_s: float,
    window_s: int,
) -> Caller:
    """Check the signature headers, in the scheme they are of. Raises `BadSignature` naming
    the header that is missing or the check that failed; an unknown key id and a wrong
    signature get one message, so a caller learns nothing about our keys."""
    if any(headers.get(name, "") for name in standard_webhooks.HEADERS):
        return verify_standard_webhooks(headers, body, keys=keys, now_s=now_s, window_s=window_s)
    key_id, timestamp, nonce, given = (headers.get(name.lower(), "") for name in HEADERS)
    missing = missing_headers(headers)
    if missing:
        if len(missing) == len(HEADERS) and any(map(_is_standard_webhooks, keys.values())):
            raise BadSignature(
                f"{_missing(missing)} (or, signed as Standard Webhooks: "
                f"{', '.join(standard_webhooks.HEADERS)})"
            )
        raise BadSignature(_missing(missing))
    if len(nonce) > MAX_NONCE_LENGTH:
        raise BadSignature(f"X-Nonce is longer than {MAX_NONCE_LENGTH} characters")
    if len(key_id) > MAX_KEY_ID_LENGTH:
        raise BadSignature(f"X-Key-Id is longer than {MAX_KEY_ID_LENGTH} characters")
    _check_timestamp("X-Timestamp", timestamp, now_s=now_s, window_s=window_s)
    secret = _pipeline_secret(keys.get(key_id))
    expected = sign(secret or "", timestamp=timestamp, nonce=nonce, body=body)
    if secret is None or not hmac.compare_digest(
        expected.encode(), given.lower().encode("utf-8", "replace")
    ):
        raise BadSignature(_NO_MATCH)
    return Caller(key_id=key_id, nonce=nonce)


def verify_standard_webhooks(
    headers: Mapping[str, str],
    body: bytes,
    *,
    keys: Mapping[str, IntakeKey],
    now_s: float,
    window_s: int,
) -> Caller:
    """Check a Standard Webhooks signature: `webhook-id` (the nonce), `webhook-timestamp`
    within `window_s` of `now_s`, and a `v1` entry of `webhook-signature` made by the key of
    a Standard Webhooks source (the one `X-Key-Id` names, if the request carries it; else
    each in turn, every one tried, each compared in constant time). Raises `BadSignature`
    as `verify` does."""
    msg_id, timestamp, signatures = (headers.get(name, "") for name in standard_webhooks.HEADERS)
    missing = [name for name in standard_webhooks.HEADERS if not headers.get(name, "")]
    if missing:
        raise BadSignature(_missing(missing))
    if len(msg_id) > MAX_NONCE_LENGTH:
        raise BadSignature(f"webhook-id is longer than {MAX_NONCE_LENGTH} characters")
    if standard_webhooks.DELIMITER in msg_id:
        raise BadSignature(
            f"webhook-id must not contain {standard_webhooks.DELIMITER!r}: it delimits the "
            "signed content"
        )
    _check_timestamp(standard_webhooks.TIMESTAMP_HEADER, timestamp, now_s=now_s, window_s=window_s)
    given = standard_webhooks.v1_signatures(signatures)
    if not given:
        raise BadSignature(
            "webhook-signature holds no v1 signature: it must be one or more "
            "v1,<base64 of the HMAC-SHA256> entries, separated by spaces"
        )
    sources = _standard_webhooks_keys(keys)
    named = headers.get("x-key-id", "")
    # A named key id that is no such source costs the same HMAC as one that is (with a key
    # that counts for nothing): the time taken says nothing of which exist.
    candidates = [(named, sources.get(named))] if named else list(sources.items())
    found: str | None = None
    for key_id, key in candidates:
        # Every source is tried, even after a match: the time taken names none of them.
        signed = standard_webhooks.matches(
            key or _NO_KEY, given, msg_id=msg_id, timestamp=timestamp, body=body
        )
        if signed and key is not None:
            found = found or key_id
    if found is None:
        raise BadSignature(_NO_MATCH_STANDARD_WEBHOOKS)
    return Caller(key_id=found, nonce=msg_id)


def _missing(names: list[str]) -> str:
    return f"missing header{'s' if len(names) > 1 else ''} {', '.join(names)}"


def _check_timestamp(header: str, value: str, *, now_s: float, window_s: int) -> None:
    if not (value.isascii() and value.isdigit() and len(value) <= _MAX_TIMESTAMP_DIGITS):
        raise BadSignature(f"{header} must be unix seconds (an integer, e.g. from date +%s)")
    sent_s = int(value)
    if abs(now_s - sent_s) > window_s:
        raise BadSignature(
            f"{header} is {sent_s - int(now_s):+d} s from this server's clock; "
            f"the allowed window is {window_s} s either way"
        )


def _pipeline_secret(key: IntakeKey | None) -> str | None:
    """The secret of a key of the pipeline's own scheme; None for any other."""
    if key is not None and key.kind is IntakeKeyKind.PIPELINE:
        return key.secret.get_secret_value()
    return None


def _is_standard_webhooks(key: IntakeKey) -> bool:
    return key.kind is IntakeKeyKind.STANDARD_WEBHOOKS


def _standard_webhooks_keys(keys: Mapping[str, IntakeKey]) -> dict[str, bytes]:
    """The HMAC key of each Standard Webhooks source, by key id."""
    return {key_id: key.hmac_key() for key_id, key in keys.items() if _is_standard_webhooks(key)}
