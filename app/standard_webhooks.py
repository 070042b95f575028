"""The Standard Webhooks signature (https://www.standardwebhooks.com), both ways: the intake
checks a source's requests with it, the HTTP sink signs its deliveries with it.

A secret is `whsec_` and the base64 of the key. A signed request carries `webhook-id`,
`webhook-timestamp` (unix seconds) and `webhook-signature`: space-separated entries
`v1,<base64 of HMAC-SHA256(key, id "." timestamp "." body)>`, one per key the sender signs
with (several while a key is rotated); entries of other versions are not ours to check.
Everything here works on the body's raw bytes. Standard library only."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable

SECRET_PREFIX = "whsec_"  # noqa: S105 - the prefix of every secret, not a secret
# The specification's shortest symmetric key: 24 bytes (192 bits).
MIN_KEY_BYTES = 24
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
HEADERS = (ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER)
# The version of a symmetric (HMAC-SHA256) signature; `v1a` is the asymmetric one.
VERSION = "v1"
# The signed content's delimiter: an id holding it could pass for another id and timestamp.
DELIMITER = "."
_DIGEST_BYTES = hashlib.sha256().digest_size


def decode_secret(secret: str) -> bytes:
    """The key of a `whsec_<base64>` secret. Raises `ValueError` saying what is wrong with
    it, never quoting it."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"must be {SECRET_PREFIX} followed by the base64 of the key")
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        # Some senders drop the base64 padding; the key is the same.
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(
            f"is not valid base64 after {SECRET_PREFIX} (letters, digits, '+', '/', '=')"
        ) from None
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"decodes to a key of {len(key)} bytes; a Standard Webhooks key has at least "
            f"{MIN_KEY_BYTES}"
        )
    return key


def digest(key: bytes, *, msg_id: str, timestamp: str, body: bytes) -> bytes:
    """HMAC-SHA256(key, `msg_id` "." `timestamp` "." `body`)."""
    message = f"{msg_id}{DELIMITER}{timestamp}{DELIMITER}".encode() + body
    return hmac.new(key, message, hashlib.sha256).digest()


def signature(key: bytes, *, msg_id: str, timestamp: str, body: bytes) -> str:
    """One `webhook-signature` entry: `v1,<base64 of the digest>`."""
    signed = digest(key, msg_id=msg_id, timestamp=timestamp, body=body)
    return f"{VERSION},{base64.b64encode(signed).decode()}"


def signed_headers(key: bytes, *, msg_id: str, timestamp_s: int, body: bytes) -> dict[str, str]:
    """The three headers that sign `body` with `key`, sent at `timestamp_s`."""
    timestamp = str(timestamp_s)
    return {
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: signature(key, msg_id=msg_id, timestamp=timestamp, body=body),
    }


def v1_signatures(header: str) -> list[bytes]:
    """The digests of the `v1` entries of a `webhook-signature` value, in order. Entries of
    another version, and malformed ones (no comma, not base64, not a SHA-256 digest), are
    left out: a match among the others is still a match."""
    found: list[bytes] = []
    for entry in header.split():
        version, sep, encoded = entry.partition(",")
        if version != VERSION or not sep:
            continue
        try:
            signed = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        if len(signed) == _DIGEST_BYTES:
            found.append(signed)
    return found


def matches(
    key: bytes, given: Iterable[bytes], *, msg_id: str, timestamp: str, body: bytes
) -> bool:
    """Whether one of the `given` digests is the one `key` makes; each compared in
    constant time."""
    expected = digest(key, msg_id=msg_id, timestamp=timestamp, body=body)
    # Every entry is compared (no early exit), so the time taken says nothing of which matched.
    return sum(hmac.compare_digest(expected, signed) for signed in given) > 0
