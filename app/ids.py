"""Record ids: ULIDs (48-bit millisecond time + 80 random bits, Crockford base32).

They sort by creation time, so keyset pagination by id walks the journal in order."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

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
