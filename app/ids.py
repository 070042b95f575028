"""Identifiers: record ids and the journal's dedup keys.

A record id is a ULID (48-bit millisecond time + 80 random bits, Crockford base32): ids sort by
creation time, so keyset pagination by id walks the journal in order.

A dedup key has one namespace per source, `<namespace>:<rest>`, so that no two
sources can spell the same key.

An intake request's key is `<key id>:<nonce>`: a key id never contains `:`, so the first
`:` ends it whatever the nonce holds, and a pair (key id, nonce) spells one key only. The
pipeline's own sources write under names no intake key id may take (`RESERVED`): a
scheduled fire is `schedule:<name>:<fire time>`; dev mode's unsigned requests are
`dev:<nonce>`. The stored format is the one the intake has always written."""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_id(now: datetime) -> str:
    """A new 26-character ULID for a record created at `now`."""
    value = (int(now.timestamp() * 1000) << 80) | secrets.randbits(80)
    chars = []
    for _ in range(26):
        value, digit = divmod(value, 32)
        chars.append(_ALPHABET[digit])
    return "".join(reversed(chars))


def digest(content: bytes) -> str:
    """The hex SHA-256 of `content`: what tells a request sent again from another one."""
    return hashlib.sha256(content).hexdigest()


def is_id(text: str) -> bool:
    """Whether `text` could be an id `new_id` made: 26 characters of its alphabet, the
    first no more than 7 (a ULID's 128 bits). A cursor of a page is one."""
    return len(text) == 26 and text[0] <= "7" and all(c in _ALPHABET for c in text)


SEPARATOR = ":"
SCHEDULE = "schedule"
DEV = "dev"
# Names the pipeline writes, or may write, keys under: beat's fires, dev mode's unsigned
# requests, the benchmark's records (`bench:<n>`, written straight into its journal), and
# replay (a record source); and the names a line's senders are shown under besides their
# own (`app.admission.senders`: the rest of them, and records pushed without one).
OTHER_SENDERS, UNNAMED = "other", "unnamed"
RESERVED = frozenset({SCHEDULE, DEV, "bench", "replay", OTHER_SENDERS, UNNAMED})
# An intake key id is sent in X-Key-Id and stored in the key; the nonce has the same bound.
MAX_KEY_ID_LENGTH = 128
# A shorter HMAC secret is guessable offline from one signed request.
MIN_SECRET_BYTES = 16


def key_id_problem(key_id: str) -> str | None:
    """Why `key_id` cannot be an intake key id, or None when it can."""
    if not key_id:
        return "is empty"
    if SEPARATOR in key_id:
        return f"contains {SEPARATOR!r}, which ends a key id in the dedup key"
    if key_id.lower() in RESERVED:
        return f"is reserved for the pipeline's own records ({', '.join(sorted(RESERVED))})"
    if len(key_id) > MAX_KEY_ID_LENGTH:
        return f"is longer than {MAX_KEY_ID_LENGTH} characters"
    if not key_id.isprintable() or any(c.isspace() for c in key_id):
        return "contains a space or a control character, which no header can carry"
    return None


def intake_key(key_id: str, nonce: str) -> str:
    """The dedup key of an intake request."""
    return f"{key_id}{SEPARATOR}{nonce}"


def sender_of(dedup_key: str) -> str:
    """Who a record came from: its dedup key's namespace (an intake key id, `schedule`,
    `dev`, `bench`)."""
    return dedup_key.partition(SEPARATOR)[0]


def schedule_key(name: str, fire: datetime) -> str:
    """The dedup key of a schedule's fire."""
    return f"{SCHEDULE}{SEPARATOR}{name}{SEPARATOR}{fire.astimezone(UTC).isoformat()}"
