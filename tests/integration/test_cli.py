"""The `pipeline` command: the whole stack with `pipeline up`, and bad settings at start."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.local.embedded_redis import answers
from tests.support.processes import TLS_CONTEXT, free_port, group_alive, wait_for

PIPELINE = str(Path(sys.executable).with_name("pipeline"))


def clean_env(**variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    return env | variables


def test_pipeline_up_serves_delivers_and_leaves_no_process_after_sigint(harness, tmp_path):
    redis_url = f"redis://127.0.0.1:{free_port()}/0"
    assert not answers(redis_url)
    port = free_port()
    flower_port = free_port()
    env = clean_env(
        PIPELINE_REDIS_URL=redis_url,
        PIPELINE_INTAKE_PORT=str(port),
        PIPELINE_FLOWER_PORT=str(flower_port),
        PIPELINE_LINES__ORDER__CONCURRENCY="1",
        PIPELINE_LINES__REFUND__CONCURRENCY="1",
        PIPELINE_LINES__STATUS__CONCURRENCY="1",
    )
    if not harness.env["PIPELINE_DATABASE_URL"].startswith("sqlite"):
        env["PIPELINE_DATABASE_URL"] = harness.env["PIPELINE_DATABASE_URL"]
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        up = subprocess.Popen(
            [PIPELINE, "up"],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    pids: set[int] = set()
    try:
        base = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            assert up.poll() is None, log_path.read_text()
            try:
                return httpx.get(f"{base}/readyz", timeout=2, verify=TLS_CONTEXT).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout_s=60, what="/readyz to turn 200")
        assert answers(redis_url)  # the embedded server
        response = httpx.post(f"{base}/v1/order", json={"business_no": "UP-1"}, timeout=10)
        assert response.status_code == 202
        record_id = response.json()["id"]

        def done() -> bool:
            record = httpx.get(f"{base}/v1/records/{record_id}", timeout=5).json()
            return record["status"] == "done"

        wait_for(done, timeout_s=60, what="the posted record to be done")
        # Flower starts once the workers answer; the banner comes when it answers too.
        wait_for(lambda: "pipeline is up" in log_path.read_text(), timeout_s=60, what="the banner")
        output = log_path.read_text()
        pids = {int(pid) for pid in re.findall(r"\(pid (\d+)\)", output)}
        assert len(pids) == 7, output  # redis, intake, three workers, beat, flower

        # Flower, behind the credentials `pipeline up` generated and printed once.
        found = re.search(r"Flower .*\(user (\S+), password (\S+); shown once\)", output)
        assert found, output
        assert output.count(found.group(2)) == 1
        flower = f"http://127.0.0.1:{flower_port}/api/workers"

        def flower_answers() -> bool:
            try:
                return (
                    httpx.get(
                        flower, auth=found.groups(), timeout=5, verify=TLS_CONTEXT
                    ).status_code
                    == 200
                )
            except httpx.HTTPError:
                return False

        wait_for(flower_answers, timeout_s=60, what="Flower to answer with the credentials")
        assert httpx.get(flower, timeout=5).status_code == 401

        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0
        output = log_path.read_text()
        assert "stopped" in output
        assert not answers(redis_url)
        for pid in pids:
            assert not group_alive(pid), f"process group {pid} outlived pipeline up"
        if "PIPELINE_DATABASE_URL" not in env:
            assert (tmp_path / "pipeline.db").exists()
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(timeout=10)
        for pid in pids:
            if group_alive(pid):
                os.killpg(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PIPELINE_LINES__ORDER__OVERFLOW", "sometimes"),
        ("PIPELINE_LINES__REFUND__MAX_QUEUE_LENGTH", "-5"),
        ("PIPELINE_INTAKE_KEYS", '{"shop": '),
        ("PIPELINE_LINES__STATUS__HANDLER", "tests.support.handlers:no_such_handler"),
        ("PIPELINE_LINES__ORDER__HANDLER", "tests.support.handlers:NOT_CALLABLE"),
        ("PIPELINE_INTAKE_PORT", "eighty"),
        ("PIPELINE_REDIS_URL", "http://127.0.0.1:6379"),
    ],
)
def test_bad_setting_stops_intake_with_one_line_naming_it(variable, value, tmp_path):
    result = subprocess.run(
        [PIPELINE, "intake"],
        cwd=tmp_path,  # were it to start, its default ./pipeline.db would land here
        env=clean_env(**{variable: value}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert variable in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_bench_refuses_an_unknown_scenario_naming_those_it_has():
    run = subprocess.run(
        [PIPELINE, "bench", "--scenario", "polled", "--scenario", "nope"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2
    assert "no such scenario: nope" in run.stderr
    assert "retention" in run.stderr
    assert "Traceback" not in run.stderr
