"""Standard Webhooks at both ends, without I/O: the signature header's parsing, the
intake's check of a source's requests (against what the reference library `standardwebhooks`
signs), the settings that declare such a source or a line's signing secret, and the HTTP
sink's signed delivery (over httpx's in-process transport)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime

import aiohttp
import httpx
import pytest
from pydantic import SecretStr
from standardwebhooks import Webhook

from app import standard_webhooks
from app.config.credentials import IntakeKey, IntakeKeyKind
from app.config.settings import load_settings
from app.config.sink_settings import DeliveredStatuses
from app.delivery.sinks import deliver_http
from app.errors import BadSignature, ConfigError
from app.intake.signing import verify
from app.journal.models import Record, RecordStatus, Source
from tests.support.recorder import Received, Recorder

KEY = bytes(range(32))
SECRET = "whsec_" + base64.b64encode(KEY).decode()
OTHER_KEY = bytes(range(100, 132))
OTHER_SECRET = "whsec_" + base64.b64encode(OTHER_KEY).decode()
KEYS = {
    "shop-1": IntakeKey(secret=SecretStr("s3cret-value-of-shop-1")),
    "shop-2": IntakeKey(kind=IntakeKeyKind.STANDARD_WEBHOOKS, secret=SecretStr(SECRET)),
    "shop-3": IntakeKey(kind=IntakeKeyKind.STANDARD_WEBHOOKS, secret=SecretStr(OTHER_SECRET)),
}
BODY = b'{"business_no": "SW-1", "note": "caf\xc3\xa9"}'
NOW_S = 1_767_225_600  # 2026-01-01T00:00:00Z


def library_headers(*, secret=SECRET, msg_id="msg_1", at_s=NOW_S, body=BODY) -> dict[str, str]:
    """What a sender using the reference library sends."""
    signed = Webhook(secret).sign(msg_id, datetime.fromtimestamp(at_s, tz=UTC), body)
    return {"webhook-id": msg_id, "webhook-timestamp": str(at_s), "webhook-signature": signed}


def refusal(headers, *, body=BODY, now_s=NOW_S, keys=KEYS) -> str:
    with pytest.raises(BadSignature) as refused:
        verify(headers, body, keys=keys, now_s=now_s, window_s=300)
    return refused.value.message


# The header's parsing.


def digest_of(n: int) -> bytes:
    return hashlib.sha256(bytes([n])).digest()


def entry(version: str, signed: bytes) -> str:
    return f"{version},{base64.b64encode(signed).decode()}"


def test_every_v1_entry_is_read_in_order_and_other_versions_are_left_out():
    header = " ".join(
        [
            entry("v1", digest_of(1)),
            entry("v1a", digest_of(2) * 2),  # the asymmetric scheme's: not ours to check
            entry("v2", digest_of(3)),
            entry("v1", digest_of(4)),
        ]
    )
    assert standard_webhooks.v1_signatures(header) == [digest_of(1), digest_of(4)]


@pytest.mark.parametrize(
    "malformed",
    [
        "v1",  # no comma
        "v1,",  # nothing after it
        "v1,not base64!",
        "v1," + base64.b64encode(b"short").decode(),  # not a SHA-256 digest
        "v1," + base64.b64encode(digest_of(1)).decode().rstrip("="),  # padding cut off
        ",".join(["v1", base64.b64encode(digest_of(1)).decode(), "extra"]),
        "V1," + base64.b64encode(digest_of(1)).decode(),  # versions are lower case
        "v1,é",
    ],
)
def test_a_malformed_entry_is_left_out_and_the_well_formed_ones_still_count(malformed):
    assert standard_webhooks.v1_signatures(malformed) == []
    good = entry("v1", digest_of(9))
    assert standard_webhooks.v1_signatures(f"{malformed} {good}") == [digest_of(9)]


def test_entries_are_separated_by_any_run_of_spaces():
    header = f"  {entry('v1', digest_of(1))}   {entry('v1', digest_of(2))} "
    assert standard_webhooks.v1_signatures(header) == [digest_of(1), digest_of(2)]


def test_the_signature_is_the_base64_hmac_of_id_timestamp_and_body_as_the_library_makes_it():
    expected = hmac.new(KEY, b"msg_1.1767225600." + BODY, hashlib.sha256).digest()
    ours = standard_webhooks.signature(KEY, msg_id="msg_1", timestamp=str(NOW_S), body=BODY)
    assert ours == "v1," + base64.b64encode(expected).decode()
    assert ours == library_headers()["webhook-signature"]


@pytest.mark.parametrize(
    ("secret", "problem"),
    [
        ("a-plain-secret-of-many-bytes", "must be whsec_"),
        ("whsec_not*base64", "not valid base64"),
        ("whsec_" + base64.b64encode(bytes(23)).decode(), "23 bytes"),
        ("whsec_", "0 bytes"),
    ],
)
def test_a_bad_whsec_secret_is_refused_saying_why_without_quoting_it(secret, problem):
    with pytest.raises(ValueError, match=problem) as refused:
        standard_webhooks.decode_secret(secret)
    quoted = secret.removeprefix("whsec_")
    assert not quoted or quoted not in str(refused.value)


def test_a_whsec_secret_without_its_base64_padding_is_the_same_key():
    unpadded = "whsec_" + base64.b64encode(bytes(range(25))).decode().rstrip("=")
    assert standard_webhooks.decode_secret(unpadded) == bytes(range(25))


# The intake's check.


def test_a_request_the_library_signed_names_its_source_by_the_key_that_matches():
    caller = verify(library_headers(), BODY, keys=KEYS, now_s=NOW_S, window_s=300)
    assert (caller.key_id, caller.nonce, caller.dedup_key) == ("shop-2", "msg_1", "shop-2:msg_1")
    other = verify(library_headers(secret=OTHER_SECRET), BODY, keys=KEYS, now_s=NOW_S, window_s=300)
    assert other.key_id == "shop-3"


def test_one_matching_signature_among_several_is_enough():
    """A sender rotating its key signs with the old and the new one."""
    headers = library_headers()
    stale = library_headers(secret="whsec_" + base64.b64encode(bytes(40)).decode())
    headers["webhook-signature"] = " ".join(
        [
            stale["webhook-signature"],
            entry("v1a", digest_of(7) * 2),
            headers["webhook-signature"],
        ]
    )
    assert verify(headers, BODY, keys=KEYS, now_s=NOW_S, window_s=300).key_id == "shop-2"


def test_an_x_key_id_naming_a_standard_webhooks_source_picks_its_key_alone():
    named = library_headers() | {"x-key-id": "shop-2"}
    assert verify(named, BODY, keys=KEYS, now_s=NOW_S, window_s=300).key_id == "shop-2"
    no_match = refusal(library_headers(), body=b"{}")
    assert refusal(library_headers() | {"x-key-id": "shop-3"}) == no_match
    assert refusal(library_headers() | {"x-key-id": "shop-1"}) == no_match  # not of this kind
    assert refusal(library_headers() | {"x-key-id": "nobody"}) == no_match
    # An unknown key id is checked with a key of zeros (to take the time a known one takes):
    # a request signed with it is no one's.
    zeros = "whsec_" + base64.b64encode(bytes(24)).decode()
    assert refusal(library_headers(secret=zeros) | {"x-key-id": "nobody"}) == no_match


def test_every_mismatch_gets_one_message_that_names_no_source():
    said = {
        refusal(library_headers(), body=BODY + b" "),  # tampered body
        refusal(library_headers(secret="whsec_" + base64.b64encode(bytes(24)).decode())),
        refusal(library_headers() | {"webhook-id": "msg_2"}),  # another id than signed
        refusal(library_headers(), keys={"shop-1": KEYS["shop-1"]}),  # no such source at all
    }
    (message,) = said
    assert message.startswith("webhook-signature does not match")
    assert "shop" not in message


def test_a_body_signed_as_bytes_is_checked_as_the_bytes_received():
    body = b'{"business_no": "SW-2", "raw": "\xff\xfe"}'  # not UTF-8
    headers = library_headers(body=body)
    assert verify(headers, body, keys=KEYS, now_s=NOW_S, window_s=300).key_id == "shop-2"


@pytest.mark.parametrize(
    ("dropped", "said"),
    [
        ({"webhook-signature"}, "missing header webhook-signature"),
        ({"webhook-id", "webhook-timestamp"}, "missing headers webhook-id, webhook-timestamp"),
    ],
)
def test_a_refusal_names_the_standard_webhooks_headers_missing(dropped, said):
    headers = {k: v for k, v in library_headers().items() if k not in dropped}
    assert refusal(headers) == said


def test_with_no_header_at_all_the_refusal_names_both_schemes_when_a_source_signs_so():
    assert refusal({}) == (
        "missing headers X-Key-Id, X-Timestamp, X-Nonce, X-Signature (or, signed as "
        "Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature)"
    )
    only_ours = {"shop-1": KEYS["shop-1"]}
    assert refusal({}, keys=only_ours) == (
        "missing headers X-Key-Id, X-Timestamp, X-Nonce, X-Signature"
    )


@pytest.mark.parametrize(
    ("headers", "now_s", "said"),
    [
        (library_headers(), NOW_S + 301, "webhook-timestamp is -301 s from this server's clock"),
        (library_headers(), NOW_S - 400, "webhook-timestamp is +400 s from this server's clock"),
        (
            library_headers() | {"webhook-timestamp": "1767225600.5"},
            NOW_S,
            "webhook-timestamp must be unix seconds",
        ),
        (library_headers(msg_id="m" * 129), NOW_S, "webhook-id is longer than 128 characters"),
        (library_headers(msg_id="msg.1"), NOW_S, "webhook-id must not contain '.'"),
        (
            library_headers() | {"webhook-signature": "v1a,AAAA v2,AAAA"},
            NOW_S,
            "webhook-signature holds no v1 signature",
        ),
    ],
)
def test_a_refusal_names_the_check_that_failed(headers, now_s, said):
    assert refusal(headers, now_s=now_s).startswith(said)


def test_the_pipelines_own_scheme_is_unchanged_beside_standard_webhooks_sources():
    from app.intake.signing import sign  # noqa: PLC0415 - the other scheme, for contrast

    headers = {
        "x-key-id": "shop-1",
        "x-timestamp": str(NOW_S),
        "x-nonce": "n-1",
        "x-signature": sign("s3cret-value-of-shop-1", timestamp=str(NOW_S), nonce="n-1", body=BODY),
    }
    assert verify(headers, BODY, keys=KEYS, now_s=NOW_S, window_s=300).dedup_key == "shop-1:n-1"
    # A Standard Webhooks source's secret does not sign X-Signature requests.
    as_ours = headers | {
        "x-key-id": "shop-2",
        "x-signature": sign(SECRET, timestamp=str(NOW_S), nonce="n-1", body=BODY),
    }
    assert refusal(as_ours).startswith("X-Signature does not match")


# The settings.


def test_a_source_of_either_kind_is_declared_in_the_intake_keys(monkeypatch):
    keys = {
        "shop-1": "s3cret-value-of-shop-1",
        "shop-2": {"kind": "standard-webhooks", "secret": SECRET},
        "shop-4": {"secret": "another-secret-of-shop-4"},
    }
    monkeypatch.setenv("PIPELINE_INTAKE_KEYS", json.dumps(keys))
    settings = load_settings()
    kinds = {key_id: key.kind for key_id, key in settings.intake_keys.items()}
    assert kinds == {
        "shop-1": IntakeKeyKind.PIPELINE,
        "shop-2": IntakeKeyKind.STANDARD_WEBHOOKS,
        "shop-4": IntakeKeyKind.PIPELINE,
    }
    assert settings.intake_keys["shop-2"].hmac_key() == KEY
    assert SECRET.removeprefix("whsec_") not in repr(settings)


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ({"kind": "standard-webhooks", "secret": "a-plain-secret-of-many-bytes"}, "whsec_"),
        ({"kind": "standard-webhooks", "secret": "whsec_!!notbase64!!"}, "base64"),
        (
            {
                "kind": "standard-webhooks",
                "secret": "whsec_" + base64.b64encode(bytes(16)).decode(),
            },
            "16 bytes",
        ),
        ({"kind": "svix", "secret": SECRET}, "kind 'svix'"),
        ({"kind": "standard-webhooks"}, "needs a secret"),
        ({"kind": "standard-webhooks", "secret": SECRET, "tolerance": 5}, "'tolerance'"),
        (42, "must have a secret"),
    ],
)
def test_a_bad_source_is_one_config_error_naming_its_key_id_never_its_secret(
    monkeypatch, key, problem
):
    monkeypatch.setenv("PIPELINE_INTAKE_KEYS", json.dumps({"shop-2": key}))
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("PIPELINE_INTAKE_KEYS: ")
    assert "'shop-2'" in message
    assert problem in message
    assert "\n" not in message
    secret = key.get("secret", "") if isinstance(key, dict) else ""
    assert not secret or secret.removeprefix("whsec_") not in message


def test_two_standard_webhooks_sources_with_one_secret_are_refused(monkeypatch):
    same = {"kind": "standard-webhooks", "secret": SECRET}
    monkeypatch.setenv("PIPELINE_INTAKE_KEYS", json.dumps({"shop-2": same, "shop-5": same}))
    with pytest.raises(ConfigError, match="'shop-2' and 'shop-5' have the same"):
        load_settings()


def test_a_lines_signing_secret_is_checked_at_start_and_kept_out_of_repr(monkeypatch):
    monkeypatch.setenv("PIPELINE_LINES__SHIPMENT__DOWNSTREAM_URL", "http://127.0.0.1:9/in")
    monkeypatch.setenv("PIPELINE_LINES__SHIPMENT__SIGNING_SECRET", SECRET)
    settings = load_settings()
    assert settings.lines["shipment"].signing_secret == SecretStr(SECRET)
    assert SECRET.removeprefix("whsec_") not in repr(settings)
    monkeypatch.setenv("PIPELINE_LINES__SHIPMENT__SIGNING_SECRET", "whsec_c2hvcnQ=")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value) == (
        "PIPELINE_LINES__SHIPMENT__SIGNING_SECRET: decodes to a key of 5 bytes; "
        "a Standard Webhooks key has at least 24"
    )


def test_a_signing_secret_on_a_line_without_the_http_sink_is_refused(monkeypatch):
    monkeypatch.setenv("PIPELINE_LINES__ORDER__SIGNING_SECRET", SECRET)
    with pytest.raises(ConfigError, match="signing_secret signs the HTTP sink's deliveries"):
        load_settings()


# The HTTP sink.


def record(**values) -> Record:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    fields = {
        "id": "01KDELIVERY0000000000000001",
        "line": "shipment",
        "business_no": "SH-1",
        "source": Source.INTAKE,
        "dedup_key": "shop-2:msg_1",
        "body_sha256": "0" * 64,
        "payload": {"business_no": "SH-1", "note": "café", "n": 1.5},
        "status": RecordStatus.ENQUEUED,
        "attempts": 2,
        "next_attempt_at": None,
        "last_error": None,
        "created_at": now,
        "updated_at": now,
        "finished_at": None,
        "task_id": None,
    }
    return Record(**(fields | values))


def delivered_request(*, signing_secret: SecretStr | None, clock=time.time) -> Received:
    """What a downstream (a real server on 127.0.0.1) received of one delivery."""
    downstream = Recorder(status=204).start()

    async def deliver() -> int:
        async with aiohttp.ClientSession() as session:
            return await deliver_http(
                session,
                record(),
                url=f"{downstream.url}/in",
                delivered=DeliveredStatuses.parse("2xx"),
                timeout_s=5,
                signing_secret=signing_secret,
                clock=clock,
            )

    try:
        assert asyncio.run(deliver()) == 204
    finally:
        downstream.stop()
    (request,) = downstream.snapshot()
    request.headers = {name.lower(): value for name, value in request.headers.items()}
    return request


def test_a_delivery_with_a_signing_secret_verifies_with_the_library_over_the_bytes_sent():
    request = delivered_request(signing_secret=SecretStr(SECRET))
    headers = dict(request.headers)
    assert headers["webhook-id"] == headers["idempotency-key"] == record().id
    assert headers["content-type"] == "application/json"
    # The library checks the timestamp against its own clock: this one is now.
    Webhook(SECRET).verify(request.raw, headers, json_parse=False)
    assert json.loads(request.raw) == {
        "id": record().id,
        "line": "shipment",
        "business_no": "SH-1",
        "payload": {"business_no": "SH-1", "note": "café", "n": 1.5},
    }


def test_a_delivery_is_signed_at_the_time_of_its_attempt():
    request = delivered_request(signing_secret=SecretStr(SECRET), clock=lambda: NOW_S + 0.9)
    assert request.headers["webhook-timestamp"] == str(NOW_S)
    caller = verify(dict(request.headers), request.raw, keys=KEYS, now_s=NOW_S, window_s=300)
    assert (caller.key_id, caller.nonce) == ("shop-2", record().id)


def test_a_delivery_without_a_signing_secret_is_the_body_it_always_was_and_unsigned():
    request = delivered_request(signing_secret=None)
    assert not {"webhook-id", "webhook-timestamp", "webhook-signature"} & set(request.headers)
    body = {
        "id": record().id,
        "line": "shipment",
        "business_no": "SH-1",
        "payload": {"business_no": "SH-1", "note": "café", "n": 1.5},
    }
    # The bytes httpx's json= wrote before the body was serialized here.
    assert request.raw == httpx.Request("POST", "http://x", json=body).content
    assert request.headers["idempotency-key"] == record().id
    assert request.headers["x-attempt"] == "2"
