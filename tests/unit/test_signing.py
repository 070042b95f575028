from __future__ import annotations

import hashlib
import hmac

import pytest
from pydantic import SecretStr

from app.errors import BadSignature
from app.intake.signing import sign, verify

KEYS = {"k1": SecretStr("secret-1"), "k2": SecretStr("secret-2")}
BODY = b'{"business_no": "A-1"}'


def headers(*, key_id="k1", secret="secret-1", ts="1000", nonce="n1", body=BODY):
    return {
        "x-key-id": key_id,
        "x-timestamp": ts,
        "x-nonce": nonce,
        "x-signature": sign(secret, timestamp=ts, nonce=nonce, body=body),
    }


def test_signature_over_timestamp_nonce_and_body_verifies_and_names_the_dedup_key():
    caller = verify(headers(), BODY, keys=KEYS, now_s=1000, window_s=300)
    assert caller.dedup_key == "k1:n1"
    upper = headers() | {"x-signature": headers()["x-signature"].upper()}
    assert verify(upper, BODY, keys=KEYS, now_s=1000, window_s=300).key_id == "k1"


def test_signature_matches_the_documented_formula():
    expected = hmac.new(b"secret-1", b"1000\nn1\n" + BODY, hashlib.sha256).hexdigest()
    assert sign("secret-1", timestamp="1000", nonce="n1", body=BODY) == expected


@pytest.mark.parametrize(
    ("given", "now_s"),
    [
        (headers(body=b'{"business_no": "A-2"}'), 1000),  # body changed after signing
        (headers(secret="secret-2"), 1000),  # another key's secret
        (headers(key_id="k9"), 1000),  # unknown key id
        (headers(), 1301),  # too old
        (headers(), 699),  # from the future
        (headers(ts="soon"), 1000),
        (headers(ts="1" + "0" * 400), 1000),  # a number too large to compare
        (headers() | {"x-signature": "é" * 64}, 1000),  # not hex, not even ASCII
        (headers(nonce="n" * 129), 1000),
        ({k: v for k, v in headers().items() if k != "x-signature"}, 1000),
        ({}, 1000),
    ],
)
def test_bad_or_missing_signature_is_refused(given, now_s):
    with pytest.raises(BadSignature):
        verify(given, BODY, keys=KEYS, now_s=now_s, window_s=300)
