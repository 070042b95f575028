"""Signing without guesswork: `pipeline send`, the client module, and the README's shell
example, each against a live intake."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app import client
from tests.support.processes import REPO, free_port
from tests.support.services import require

PIPELINE = str(Path(sys.executable).with_name("pipeline"))
KEY_ID, SECRET = "shop-1", "its-secret-of-32-random-bytes-xx"


def readme_snippet() -> str:
    """The README's signed request, as it is printed there: the code block that starts
    with `body=`. It must run on a stock Debian: bash, date, curl and openssl."""
    readme = (REPO / "README.md").read_text()
    blocks = readme.split("```")[1::2]
    (snippet,) = [b for b in blocks if b.lstrip("\n").startswith("body='")]
    return snippet


@pytest.fixture
def intake(harness):
    harness.configure(intake_keys=json.dumps({KEY_ID: SECRET}))
    return harness.start_intake()


def pipeline_send(
    harness, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PIPELINE, "send", *args],
        cwd=REPO,
        env=harness.env | (env or {}),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_readme_shell_example_posts_a_signed_record(harness, intake):
    for tool in ("bash", "curl", "openssl"):
        require(shutil.which(tool), f"the README's example needs {tool}")
    bash = shutil.which("bash")
    printed = readme_snippet()
    snippet = printed.replace("http://127.0.0.1:8000", str(intake.base_url).rstrip("/"))
    assert snippet != printed
    ran = subprocess.run(
        [bash, "-euo", "pipefail", "-c", snippet],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    answer, status = ran.stdout.strip().splitlines()
    assert status == "202", ran.stdout
    assert json.loads(answer)["status"] == "enqueued"
    assert [r.business_no for r in harness.records()] == ["ORD-1002"]


def test_pipeline_send_signs_with_the_key_of_the_settings_and_prints_the_answer(harness, intake):
    sent = pipeline_send(
        harness, "order", '{"business_no": "SEND-1"}', "--url", str(intake.base_url)
    )
    assert sent.returncode == 0, sent.stderr
    assert sent.stderr == ""
    answer = json.loads(sent.stdout)
    assert (answer["line"], answer["business_no"], answer["status"]) == (
        "order",
        "SEND-1",
        "enqueued",
    )
    assert [r.id for r in harness.records()] == [answer["id"]]


def test_pipeline_send_again_with_its_nonce_gets_the_same_record(harness, intake):
    args = ("order", "-", "--url", str(intake.base_url), "--nonce", "n-send-again")
    first = pipeline_send(harness, *args, stdin='{"business_no": "SEND-2"}')
    again = pipeline_send(harness, *args, stdin='{"business_no": "SEND-2"}')
    assert (first.returncode, again.returncode) == (0, 0), first.stderr + again.stderr
    assert json.loads(again.stdout)["id"] == json.loads(first.stdout)["id"]
    assert harness.record_count() == 1


def test_pipeline_send_with_a_wrong_secret_says_which_check_failed(harness, intake):
    sent = pipeline_send(
        harness,
        "order",
        '{"business_no": "SEND-3"}',
        "--url",
        str(intake.base_url),
        "--key-id",
        KEY_ID,
        "--secret",
        "not-the-secret-of-shop-1",
    )
    assert sent.returncode == 1
    assert json.loads(sent.stdout)["error"]["code"] == "bad_signature"
    (line,) = sent.stderr.strip().splitlines()
    assert line.startswith("pipeline: the intake answered 401 bad_signature: X-Signature")
    assert harness.record_count() == 0


@pytest.mark.parametrize(
    ("record", "said"),
    [
        ('{"business_no": "SEND-4",', "not valid JSON"),
        ('["business_no", "SEND-4"]', "must be a JSON object"),
    ],
)
def test_pipeline_send_refuses_a_record_that_is_not_a_json_object(harness, intake, record, said):
    sent = pipeline_send(harness, "order", record, "--url", str(intake.base_url))
    assert sent.returncode == 2
    assert said in sent.stderr
    assert "Traceback" not in sent.stderr
    assert harness.record_count() == 0


def test_pipeline_send_to_an_unknown_line_hears_the_known_ones(harness, intake):
    sent = pipeline_send(
        harness, "orders", '{"business_no": "SEND-5"}', "--url", str(intake.base_url)
    )
    assert sent.returncode == 1
    (line,) = sent.stderr.strip().splitlines()
    assert line == (
        "pipeline: the intake answered 404 unknown_line: unknown line 'orders'; "
        "the lines are: order, refund, status"
    )


def test_pipeline_send_with_no_intake_says_so_and_how_to_send_again(harness):
    harness.configure(intake_keys=json.dumps({KEY_ID: SECRET}))
    url = f"http://127.0.0.1:{free_port()}"
    sent = pipeline_send(harness, "order", '{"business_no": "SEND-6"}', "--url", url)
    assert sent.returncode == 1
    (line,) = sent.stderr.strip().splitlines()
    assert line.startswith(f"pipeline: no answer from the intake at {url}")
    assert "--nonce " in line


def test_the_client_function_posts_a_signed_record_and_a_resend_gets_it_back(harness, intake):
    url = str(intake.base_url)
    nonce = client.new_nonce()
    record = {"business_no": "CLIENT-1", "amount": 42}
    first = client.send_record(url, "order", record, key_id=KEY_ID, secret=SECRET, nonce=nonce)
    again = client.send_record(url, "order", record, key_id=KEY_ID, secret=SECRET, nonce=nonce)
    assert (first.status, again.status) == (202, 200)
    assert first.body["status"] == "enqueued"
    assert again.body["id"] == first.body["id"]
    assert first.nonce == nonce
    other = client.send_record(
        url, "order", {"business_no": "CLIENT-2"}, key_id=KEY_ID, secret=SECRET
    )
    assert other.status == 202
    assert other.nonce != nonce
    assert harness.record_count() == 2


@pytest.mark.parametrize(
    ("dropped", "named"),
    [
        ({"X-Nonce"}, "missing header X-Nonce"),
        ({"X-Key-Id", "X-Signature"}, "missing headers X-Key-Id, X-Signature"),
        (
            {"X-Key-Id", "X-Timestamp", "X-Nonce", "X-Signature"},
            "missing headers X-Key-Id, X-Timestamp, X-Nonce, X-Signature",
        ),
    ],
)
def test_a_401_names_the_signature_headers_that_are_missing(harness, intake, dropped, named):
    body = b'{"business_no": "H-1"}'
    headers = client.signed_headers(body, key_id=KEY_ID, secret=SECRET)
    sent = {name: value for name, value in headers.items() if name not in dropped}
    answer = intake.post("/v1/order", content=body, headers=sent)
    assert answer.status_code == 401
    assert answer.json()["error"] == {"code": "bad_signature", "message": named}
    assert harness.record_count() == 0


def test_pipeline_send_to_a_dev_mode_intake_goes_unsigned_to_the_configured_port(harness):
    intake = harness.start_intake()  # no keys: dev mode
    port = str(intake.base_url.port)
    sent = pipeline_send(
        harness, "order", '{"business_no": "DEV-1"}', env={"PIPELINE_INTAKE_PORT": port}
    )
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["status"] == "enqueued"
    assert [r.business_no for r in harness.records()] == ["DEV-1"]


def test_pipeline_send_unsigned_to_an_intake_with_keys_says_how_to_sign(harness, intake):
    harness.configure(intake_keys="{}", dev_mode="false")
    sent = pipeline_send(harness, "order", '{"business_no": "S-1"}', "--url", str(intake.base_url))
    assert sent.returncode == 1
    (line,) = sent.stderr.strip().splitlines()
    assert line == (
        "pipeline: the intake answered 401 bad_signature: missing headers X-Key-Id, "
        "X-Timestamp, X-Signature (sent unsigned: set PIPELINE_INTAKE_KEYS, or give --key-id "
        "and --secret)"
    )
