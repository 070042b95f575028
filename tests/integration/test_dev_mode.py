"""Dev mode is asked for, never implied: without intake keys the intake refuses to start
unless `PIPELINE_DEV_MODE=true`; in dev mode it serves this machine only (loopback
clients, loopback `Host` names), however it is started."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.processes import REPO, TLS_CONTEXT, free_port, run_until_exit, wait_for

# HTTP and process start-up: the journal's database plays no part.
pytestmark = pytest.mark.journal_independent

PIPELINE = str(Path(sys.executable).with_name("pipeline"))
# How long a command that should refuse to start is given before it counts as started.
REFUSAL_TIMEOUT_S = 20
BODY = b'{"business_no": "DEV-1"}'


def clean_env(**variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    return env | variables


def run_briefly(argv: list[str], *, env: dict[str, str], cwd: Path) -> tuple[int | None, str]:
    return run_until_exit(argv, env=env, cwd=cwd, timeout_s=REFUSAL_TIMEOUT_S)


def assert_refused(code: int | None, stderr: str, *names: str) -> None:
    assert code == 2, f"did not refuse to start (exit code {code}): {stderr}"
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    for name in names:
        assert name in lines[0]
    assert "Traceback" not in stderr


def outward_address() -> str | None:
    """An address of this machine that is not loopback, if it has one. (Connecting a UDP
    socket sends nothing; it only picks the address a packet would leave from.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if ipaddress.ip_address(address).is_loopback else address


def test_without_keys_the_intake_refuses_to_start_unless_dev_mode_is_asked_for(tmp_path):
    env = clean_env(PIPELINE_INTAKE_PORT=str(free_port()))
    code, stderr = run_briefly([PIPELINE, "intake"], env=env, cwd=tmp_path)
    assert_refused(code, stderr, "PIPELINE_INTAKE_KEYS", "PIPELINE_DEV_MODE")


@pytest.mark.parametrize(
    ("command", "host_option"),
    [(["intake"], []), (["intake"], ["--host", "0.0.0.0"]), (["up"], [])],  # noqa: S104
)
def test_dev_mode_refuses_a_host_that_is_not_loopback(tmp_path, command, host_option):
    env = clean_env(
        PIPELINE_DEV_MODE="true",
        PIPELINE_INTAKE_PORT=str(free_port()),
        PIPELINE_FLOWER_PORT=str(free_port()),
        # Nothing listens there: a command that got past its checks would not get far.
        PIPELINE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
    )
    if not host_option:
        env["PIPELINE_INTAKE_HOST"] = "0.0.0.0"  # noqa: S104 - the host under test
    code, stderr = run_briefly([PIPELINE, *command, *host_option], env=env, cwd=tmp_path)
    assert_refused(code, stderr, "PIPELINE_INTAKE_HOST", "127.0.0.1")


def test_the_factory_in_dev_mode_says_so_and_serves_only_this_machine(harness, tmp_path):
    """However uvicorn was told to bind, a dev-mode intake answers only clients on this
    machine: started through the factory on every address, a request that comes in from
    the network is refused."""
    outward = outward_address()
    if outward is None:
        pytest.skip("this machine has no address but loopback")
    port = free_port()
    log_path = tmp_path / "uvicorn.log"
    env = dict(harness.env)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "app.intake.asgi:app_from_env",
                "--host",
                "0.0.0.0",  # noqa: S104 - every address: what the test is about
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def healthy() -> bool:
            assert process.poll() is None, log_path.read_text()
            try:
                return (
                    httpx.get(
                        f"http://127.0.0.1:{port}/healthz", timeout=1, verify=TLS_CONTEXT
                    ).status_code
                    == 200
                )
            except httpx.HTTPError:
                return False

        wait_for(healthy, timeout_s=30, what="the factory's intake to answer")
        remote = httpx.get(f"http://{outward}:{port}/healthz", timeout=5)
        assert remote.status_code == 403, remote.text
        assert remote.json()["error"]["code"] == "not_loopback"
        posted = httpx.post(f"http://{outward}:{port}/v1/order", content=BODY, timeout=5)
        assert posted.status_code == 403
        assert harness.record_count() == 0
        assert "dev mode" in log_path.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def test_dev_mode_answers_loopback_host_names_only(harness):
    client = harness.start_intake()
    port = harness.intakes[0].port
    for host in ("evil.example", f"evil.example:{port}", "192.0.2.7", "localhost.evil.example"):
        refused = client.post("/v1/order", content=BODY, headers={"host": host})
        assert refused.status_code == 421, (host, refused.text)
        assert refused.json()["error"]["code"] == "host_not_allowed"
        # The admin endpoints are open in dev mode: a rebound name must not read them.
        listed = client.get("/v1/records", headers={"host": host})
        assert listed.status_code == 421
    assert harness.record_count() == 0
    for n, host in enumerate((f"127.0.0.1:{port}", f"localhost:{port}", "[::1]", "LOCALHOST")):
        body = b'{"business_no": "DEV-%d"}' % n
        served = client.post("/v1/order", content=body, headers={"host": host})
        assert served.status_code == 202, (host, served.text)
    assert client.get("/v1/records").status_code == 200
    assert harness.record_count() == 4
