"""Standard Webhooks at both ends, over real HTTP: a source signing with the reference
library (`standardwebhooks`) pushes to a live intake, and the HTTP sink's deliveries to a
downstream double verify with the same library. The examples of docs/http-api.md run as
printed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from tests.support.harness import signed_headers
from tests.support.processes import REPO, wait_for
from tests.support.recorder import Recorder
from tests.support.services import require

PIPELINE = str(Path(sys.executable).with_name("pipeline"))
SOURCE, SECRET = "shop-2", "whsec_O58MKnHYTlWmwPGeLXtMg+ah8F2SxHs+ig1fbBsuepQ="
OTHER_SECRET = "whsec_" + "QUJD" * 11  # a valid key of 33 bytes, not the source's
OURS, OUR_SECRET = "shop-1", "its-secret-of-32-random-bytes-xx"
KEYS = {OURS: OUR_SECRET, SOURCE: {"kind": "standard-webhooks", "secret": SECRET}}
BODY = b'{"business_no": "SW-1", "note": "caf\xc3\xa9"}'


def library_signed(
    body: bytes, *, msg_id: str, secret: str = SECRET, at_s: float | None = None
) -> dict[str, str]:
    """The headers a sender using the reference library sends with `body`."""
    at = datetime.fromtimestamp(time.time() if at_s is None else at_s, tz=UTC)
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, at, body),
    }


@pytest.fixture
def intake(harness):
    harness.configure(intake_keys=json.dumps(KEYS))
    return harness.start_intake()


def test_a_webhook_the_library_signed_is_taken_and_sent_again_is_the_same_record(harness, intake):
    first = intake.post("/v1/order", content=BODY, headers=library_signed(BODY, msg_id="msg_1"))
    assert first.status_code == 202, first.text
    assert first.json()["status"] == "enqueued"

    # The sender retries later: a new timestamp and signature, the same id and body.
    again_headers = library_signed(BODY, msg_id="msg_1", at_s=time.time() + 2)
    again = intake.post("/v1/order", content=BODY, headers=again_headers)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()

    other_body = b'{"business_no": "SW-2"}'
    reused = intake.post(
        "/v1/order", content=other_body, headers=library_signed(other_body, msg_id="msg_1")
    )
    assert reused.status_code == 409, reused.text
    assert reused.json()["error"]["code"] == "nonce_reused"

    (record,) = harness.records()
    assert (record.id, record.dedup_key) == (first.json()["id"], f"{SOURCE}:msg_1")
    assert record.payload == json.loads(BODY)


def test_the_pipelines_own_scheme_still_signs_beside_a_standard_webhooks_source(harness, intake):
    body = b'{"business_no": "OURS-1"}'
    ours = intake.post(
        "/v1/order", content=body, headers=signed_headers(OURS, OUR_SECRET, body, nonce="msg_1")
    )
    assert ours.status_code == 202, ours.text
    # The same nonce from the other source is the other source's record.
    theirs = intake.post("/v1/order", content=body, headers=library_signed(body, msg_id="msg_1"))
    assert theirs.status_code == 202, theirs.text
    assert sorted(r.dedup_key for r in harness.records()) == [f"{OURS}:msg_1", f"{SOURCE}:msg_1"]


def _tampered() -> tuple[bytes, dict[str, str]]:
    return BODY.replace(b"SW-1", b"SW-9"), library_signed(BODY, msg_id="msg_t")


def _wrong_secret() -> tuple[bytes, dict[str, str]]:
    return BODY, library_signed(BODY, msg_id="msg_w", secret=OTHER_SECRET)


def _old() -> tuple[bytes, dict[str, str]]:
    return BODY, library_signed(BODY, msg_id="msg_o", at_s=time.time() - 3600)


def _unsigned() -> tuple[bytes, dict[str, str]]:
    headers = library_signed(BODY, msg_id="msg_u")
    del headers["webhook-signature"]
    return BODY, headers


@pytest.mark.parametrize(
    ("request_of", "said"),
    [
        (_tampered, "webhook-signature does not match"),
        (_wrong_secret, "webhook-signature does not match"),
        (_old, "webhook-timestamp is -36"),
        (_unsigned, "missing header webhook-signature"),
    ],
    ids=["tampered-body", "wrong-secret", "old-timestamp", "missing-header"],
)
def test_a_bad_standard_webhooks_request_is_401_saying_why(harness, intake, request_of, said):
    body, headers = request_of()
    answer = intake.post("/v1/order", content=body, headers=headers)
    assert answer.status_code == 401, answer.text
    error = answer.json()["error"]
    assert error["code"] == "bad_signature"
    assert error["message"].startswith(said), error["message"]
    assert SOURCE not in error["message"]
    assert harness.record_count() == 0


def pipeline_send(harness, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PIPELINE, "send", *args],
        cwd=REPO,
        env=harness.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_pipeline_send_signs_as_standard_webhooks_with_a_key_of_that_kind(harness, intake):
    harness.configure(intake_keys=json.dumps({SOURCE: KEYS[SOURCE]}))
    args = ("order", '{"business_no": "SEND-SW"}', "--url", str(intake.base_url))
    first = pipeline_send(harness, *args, "--nonce", "msg_send")
    again = pipeline_send(harness, *args, "--nonce", "msg_send")
    assert (first.returncode, again.returncode) == (0, 0), first.stderr + again.stderr
    assert json.loads(again.stdout)["id"] == json.loads(first.stdout)["id"]
    (record,) = harness.records()
    assert record.dedup_key == f"{SOURCE}:msg_send"


def docs_block(first_line: str) -> str:
    """The code block of docs/http-api.md (its "Standard Webhooks sources") that starts
    with `first_line`."""
    blocks = (REPO / "docs" / "http-api.md").read_text().split("```")[1::2]
    (block,) = [b for b in blocks if b.lstrip("\n").startswith(first_line)]
    return block


def test_the_docs_examples_post_a_record_as_a_standard_webhooks_source(harness, intake):
    for tool in ("bash", "curl", "openssl", "base64", "od"):
        require(shutil.which(tool), f"the example needs {tool}")
    url = str(intake.base_url).rstrip("/")
    shell = docs_block("secret=whsec_").replace("http://127.0.0.1:8000", url)
    ran = subprocess.run(
        [shutil.which("bash") or "bash", "-euo", "pipefail", "-c", shell],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    answer, status = ran.stdout.strip().splitlines()
    assert status == "202", ran.stdout
    assert json.loads(answer)["status"] == "enqueued"

    python = docs_block("from datetime import").replace("http://127.0.0.1:8000", url)
    ran = subprocess.run(
        [sys.executable, "-c", python], capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("202 "), ran.stdout
    assert sorted(r.business_no for r in harness.records()) == ["ORD-1004", "ORD-1005"]
    assert {r.dedup_key.partition(":")[0] for r in harness.records()} == {SOURCE}


def test_the_http_sinks_deliveries_verify_with_the_library_at_every_attempt(harness):
    """The first attempt is answered 500, a later one 200: each is signed anew, over the
    exact bytes sent, and the library's verify takes every one."""
    recorder = Recorder(status=500).start()
    try:
        harness.configure(
            lines__shipment__downstream_url=f"{recorder.url}/in",
            lines__shipment__signing_secret=SECRET,
            lines__shipment__backoff_initial_s="0.2",
            lines__shipment__backoff_max_s="0.5",
            sweep_interval_seconds="0.5",
        )
        client = harness.start_intake()  # dev mode: the push itself is unsigned
        harness.start_worker("shipment", pool=None, concurrency=None)
        harness.start_beat()
        answer = client.post("/v1/shipment", json={"business_no": "SH-1", "note": "café"})
        assert answer.status_code == 202, answer.text
        record_id = answer.json()["id"]
        wait_for(recorder.snapshot, timeout_s=60, what="the first attempt")
        recorder.status = 200
        final = harness.wait_until_final({record_id}, timeout_s=90)
        assert final[record_id].status.value == "done"

        received = recorder.snapshot()
        # A retry may come before the answer turns 200: 500s, then the one 200.
        answered = [r.answered for r in received]
        assert answered[-1] == 200
        assert answered[:-1] == [500] * (len(answered) - 1) != []
        for attempt, request in enumerate(received, start=1):
            headers = {name.lower(): value for name, value in request.headers.items()}
            assert headers["webhook-id"] == headers["idempotency-key"] == record_id
            assert headers["x-attempt"] == str(attempt)
            verified = Webhook(SECRET).verify(request.raw, request.headers)
            assert verified == request.body
            assert verified["payload"] == {"business_no": "SH-1", "note": "café"}
            assert abs(int(headers["webhook-timestamp"]) - time.time()) < 120
        with pytest.raises(WebhookVerificationError, match="No matching signature"):
            Webhook(OTHER_SECRET).verify(received[0].raw, received[0].headers)
        logs = "".join(component.output() for component in harness.components)
        assert SECRET.removeprefix("whsec_") not in logs
    finally:
        recorder.stop()


def test_a_dev_mode_intake_takes_a_webhook_id_as_the_nonce(harness):
    """Unsigned in dev mode, a Standard Webhooks sender's retry is still the one record."""
    client = harness.start_intake()  # no keys: dev mode
    headers = library_signed(BODY, msg_id="msg_dev")
    first = client.post("/v1/order", content=BODY, headers=headers)
    again = client.post("/v1/order", content=BODY, headers=headers)
    assert (first.status_code, again.status_code) == (202, 200), first.text + again.text
    assert again.json()["id"] == first.json()["id"]
    (record,) = harness.records()
    assert record.dedup_key == "dev:msg_dev"
