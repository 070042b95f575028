"""Secrets stay secret: a stack that uses every one of them (intake key secret, admin
token, webhook secrets and a DingTalk access token, Redis password, database password on
PostgreSQL, Flower's password) runs, raises alerts and refuses bad requests; then every
log line, alert, `pipeline status`, `/v1/lines`, `/v1/alerts`, `/metrics`, the status page
and every error body is searched for each secret."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from app.local.embedded_redis import RedisServer
from tests.support.harness import signed_headers
from tests.support.processes import TLS_CONTEXT, free_port, run_until_exit, wait_for
from tests.support.recorder import Recorder

PIPELINE = str(Path(sys.executable).with_name("pipeline"))
SECRETS = {
    "intake key secret": "intake-secret-7d1f0c",
    "admin token": "admin-token-9b2c4e7d",
    "generic webhook secret": "hook-secret-41aa9d",
    "dingtalk secret": "ding-secret-55e0b1",
    "dingtalk access token": "ding-token-8f3e27",
    "redis password": "redis-pass-c0de42",
    "flower password": "flower-pass-77ab13",
    "database password": "db-pass-1a2b3c",
}
KEY_ID = "shop-1"


def test_no_secret_reaches_a_log_an_alert_or_an_answer(harness, tmp_path):
    redis_server = RedisServer(
        port=free_port(), workdir=tmp_path / "redis", password=SECRETS["redis password"]
    )
    redis_server.start()
    recorder = Recorder().start()
    try:
        _run_and_search(harness, tmp_path, redis_server, recorder)
    finally:
        recorder.stop()
        redis_server.stop()


def _run_and_search(harness, tmp_path, redis_server, recorder) -> None:
    port, flower_port = free_port(), free_port()
    database = harness.env["PIPELINE_DATABASE_URL"]
    if not database.startswith("sqlite"):  # trust auth: the password is sent, not needed
        url = make_url(database).set(password=SECRETS["database password"])
        database = url.render_as_string(hide_password=False)
    harness.configure(
        redis_url=redis_server.url,
        database_url=database,
        intake_keys=json.dumps({KEY_ID: SECRETS["intake key secret"]}),
        admin_token=SECRETS["admin token"],
        intake_port=str(port),
        flower_port=str(flower_port),
        flower_basic_auth=f"ops:{SECRETS['flower password']}",
        alert_webhooks=json.dumps(
            [
                {
                    "kind": "generic",
                    "url": f"{recorder.url}/generic",
                    "secret": SECRETS["generic webhook secret"],
                },
                {
                    "kind": "dingtalk",
                    "url": f"{recorder.url}/ding?access_token={SECRETS['dingtalk access token']}",
                    "secret": SECRETS["dingtalk secret"],
                },
            ]
        ),
        lines__refund__max_queue_length="1",
        monitor_interval_seconds="1",
        log_level="DEBUG",
    )
    harness.start_worker("order")
    harness.start_beat()
    flower = harness.run("flower")
    intake = harness.run("intake")
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(f"{base}/healthz"), timeout_s=30, what="the intake")
    answers: list[str] = []

    def post(line: str, body: bytes, nonce: str | None = None, **headers: str) -> httpx.Response:
        sent = signed_headers(KEY_ID, SECRETS["intake key secret"], body, nonce=nonce) | headers
        response = httpx.post(f"{base}/v1/{line}", content=body, headers=sent, timeout=10)
        answers.append(response.text)
        return response

    ok = post("order", b'{"business_no": "S-1"}')
    assert ok.status_code == 202
    # Every component works through the password-protected Redis: the worker delivers.
    harness.wait_until_final({ok.json()["id"]}, timeout_s=60)
    for n in range(3):  # the refund line has no worker and room for one: QUEUE_FULL
        post("refund", json.dumps({"business_no": f"R-{n}"}).encode())
    assert post("order", b'{"business_no": "S-2"}', **{"x-signature": "0" * 64}).status_code == 401
    assert post("order", b'{"business_no": ').status_code == 400
    assert post("order", b'{"amount": 1}').status_code == 422
    assert post("nosuchline", b'{"business_no": "S-3"}').status_code == 404
    post("order", b'{"business_no": "S-4"}', nonce="nonce-reused")
    assert post("order", b'{"business_no": "S-5"}', nonce="nonce-reused").status_code == 409
    for headers in ({}, {"authorization": "Bearer wrong-token"}):
        response = httpx.get(f"{base}/v1/records", headers=headers, timeout=10)
        assert response.status_code in (401, 403)
        answers.append(response.text)
    for path in ("/v1/lines", "/v1/alerts", "/metrics", "/", "/openapi.json", "/readyz"):
        answers.append(httpx.get(f"{base}{path}", timeout=10).text)
    wait_for(
        lambda: any(r.path == "/generic" for r in recorder.snapshot()),
        timeout_s=30,
        what="an alert at the webhook",
    )
    flower_url = f"http://127.0.0.1:{flower_port}/api/workers"
    wait_for(
        lambda: _answers(flower_url, auth=("ops", SECRETS["flower password"])),
        timeout_s=30,
        what="Flower",
    )
    answers.append(httpx.get(flower_url, timeout=10).text)  # refused without the password
    status = subprocess.run(
        [PIPELINE, "status"],
        env={**harness.env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # Proves an absence, so time must pass: what the components log after the traffic (two
    # runs of the 1 s monitor, the alerts they raise) is searched too, and no one event
    # marks the last of it.
    time.sleep(2)
    harness.close()  # stops every component: their shutdown lines are searched too

    places: dict[str, str] = {
        "pipeline status": status.stdout + status.stderr,
        "answers": "\n".join(answers),
        "alerts": "\n".join(r.raw.decode(errors="replace") for r in recorder.snapshot()),
    }
    for component in [*harness.components, intake, flower]:
        places[f"log of {' '.join(component.args)}"] = component.output()
    assert "QUEUE_FULL" in places["alerts"]
    leaks = [
        f"{name} in {place}"
        for place, text in places.items()
        for name, secret in SECRETS.items()
        if secret in text
    ]
    assert leaks == [], leaks


def _answers(url: str, auth: tuple[str, str] | None = None) -> bool:
    try:
        return httpx.get(url, auth=auth, timeout=2, verify=TLS_CONTEXT).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("command", ["flower", "up"])
def test_a_flower_credential_with_a_comma_stops_flower_and_up_at_start(command, tmp_path):
    """Flower splits its credential on commas: `admin:abc,def` would let in `admin:abc`
    and a bare `def`. Such a credential stops the command with one line that names the
    variable and shows nothing of the credential."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env |= {
        "PIPELINE_FLOWER_BASIC_AUTH": "admin:abc-secret,def-secret",
        "PIPELINE_FLOWER_PORT": str(free_port()),
        "PIPELINE_INTAKE_PORT": str(free_port()),
        # Nothing listens there: a command that got past its checks would not get far.
        "PIPELINE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    code, stderr = run_until_exit([PIPELINE, command], env=env, cwd=tmp_path, timeout_s=20)
    assert code == 2, f"{command} did not refuse to start (exit code {code}): {stderr}"
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "PIPELINE_FLOWER_BASIC_AUTH" in lines[0]
    assert "abc-secret" not in stderr
    assert "def-secret" not in stderr
