from __future__ import annotations

import hashlib
import hmac

import pytest
from pydantic import SecretStr

from app.config.credentials import IntakeKey
from app.errors import BadSignature
from app.intake.signing import sign, verify

KEYS = {
    "k1": IntakeKey(secret=SecretStr("secret-1")),
    "k2": IntakeKey(secret=SecretStr("secret-2")),
}
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


@pytest.mark.parametrize(
    ("dropped", "said"),
    [
        ({"x-nonce"}, "missing header X-Nonce"),
        ({"x-timestamp", "x-signature"}, "missing headers X-Timestamp, X-Signature"),
    ],
)
def test_a_refusal_names_the_missing_headers(dropped, said):
    given = {name: value for name, value in headers().items() if name not in dropped}
    with pytest.raises(BadSignature) as refused:
        verify(given, BODY, keys=KEYS, now_s=1000, window_s=300)
    assert refused.value.message == said


@pytest.mark.parametrize(
    ("given", "now_s", "said"),
    [
        (headers(), 1400, "X-Timestamp is -400 s from this server's clock"),
        (headers(ts="soon"), 1000, "X-Timestamp must be unix seconds"),
        (headers(nonce="n" * 129), 1000, "X-Nonce is longer than 128 characters"),
        (headers(secret="secret-2"), 1000, "X-Signature does not match"),
    ],
)
def test_a_refusal_names_the_check_that_failed(given, now_s, said):
    with pytest.raises(BadSignature) as refused:
        verify(given, BODY, keys=KEYS, now_s=now_s, window_s=300)
    assert refused.value.message.startswith(said)


def test_an_unknown_key_id_is_refused_as_a_wrong_signature_is():
    def refusal(given):
        with pytest.raises(BadSignature) as refused:
            verify(given, BODY, keys=KEYS, now_s=1000, window_s=300)
        return refused.value.message

    assert refusal(headers(key_id="k9")) == refusal(headers(secret="secret-2"))
