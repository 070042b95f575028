"""`pipeline up` as a new user meets it: its ports checked before anything starts, every line
after its component's name, Flower started once the workers answer, one ready banner."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.local.embedded_redis import answers
from tests.integration.test_cli import PIPELINE, clean_env
from tests.support.processes import (
    free_port,
    run_until_exit,
    start_up,
    stop_up,
    wait_for,
)

LINES = ("order", "refund", "status")
COMPONENTS = ("up", "redis", "migrate", "intake", "beat", "flower", *(f"worker-{n}" for n in LINES))
# The methods of Flower's first inspect, at its start (flower.inspector.Inspector).
FIRST_INSPECT = ("stats", "active_queues", "registered", "conf")
# How long a cold `pipeline up` may take on a small, busy machine to show its banner (~15 s
# on two cores), and Flower then its first inspect (~1 s), within the test's timeout.
START_TIMEOUT_S = 80
INSPECT_TIMEOUT_S = 20
# Flower's generated credential, as `pipeline up` shows it once.
CREDENTIAL = r"(?i)flower\s.*\(user (\S+), password (\S+); shown once\)"


def listening_socket() -> socket.socket:
    """A socket listening on a free loopback port, as another program would hold it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


def up_env(*, redis_port: int, intake_port: int, flower_port: int) -> dict[str, str]:
    return clean_env(
        PIPELINE_REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
        PIPELINE_INTAKE_PORT=str(intake_port),
        PIPELINE_FLOWER_PORT=str(flower_port),
        **{f"PIPELINE_LINES__{line.upper()}__CONCURRENCY": "1" for line in LINES},
    )


@pytest.mark.parametrize(
    ("taken", "purpose", "setting"),
    [
        ("intake", "the intake", "PIPELINE_INTAKE_PORT"),
        ("flower", "Flower", "PIPELINE_FLOWER_PORT"),
        ("redis", "the embedded Redis", "PIPELINE_REDIS_URL"),
    ],
)
def test_a_taken_port_stops_pipeline_up_before_it_starts_anything_naming_the_port(
    taken, purpose, setting, tmp_path
):
    with closing(listening_socket()) as holder:
        held = holder.getsockname()[1]
        ports = {"redis": free_port(), "intake": free_port(), "flower": free_port()} | {taken: held}
        env = up_env(
            redis_port=ports["redis"], intake_port=ports["intake"], flower_port=ports["flower"]
        )
        code, stderr = run_until_exit([PIPELINE, "up"], env=env, cwd=tmp_path, timeout_s=60)
        assert code == 2, stderr
        assert f"port {held} ({purpose}" in stderr
        assert setting in stderr
        assert "Traceback" not in stderr
        if taken != "redis":
            assert not answers(f"redis://127.0.0.1:{ports['redis']}/0")  # no embedded server
        assert not (tmp_path / "pipeline.db").exists()  # no migration
        assert not (tmp_path / ".pipeline").exists()  # no log file, no child


@dataclass
class RunningUp:
    """One `pipeline up`, up, with its output in a file."""

    process: subprocess.Popen[bytes]
    cwd: Path
    output_path: Path
    intake_port: int
    flower_port: int
    flower_auth: tuple[str, str]

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")


def flower_knows(up: RunningUp) -> dict[str, list[str]]:
    """What Flower's inspects found so far: each line's worker, and which of the first
    inspect's methods it answered."""
    url = f"http://127.0.0.1:{up.flower_port}/api/workers"
    try:
        workers = httpx.get(url, auth=up.flower_auth, timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return {
        name.partition("@")[0]: sorted(method for method in FIRST_INSPECT if method in info)
        for name, info in workers.items()
    }


def flower_first_inspect_over(up: RunningUp) -> bool:
    """Whether Flower's first inspect ended: it warned, or it knows every worker."""
    if "Inspect method" in up.output():
        return True
    return flower_knows(up) == {line: sorted(FIRST_INSPECT) for line in LINES}


@pytest.fixture(scope="module")
def running_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningUp]:
    """`pipeline up` on free ports, its embedded Redis, SQLite journal, until Flower's first
    inspect is over; then stopped by SIGINT, and what is left of it killed by PID."""
    cwd = tmp_path_factory.mktemp("up")
    redis_port, intake_port, flower_port = free_port(), free_port(), free_port()
    env = up_env(redis_port=redis_port, intake_port=intake_port, flower_port=flower_port)
    output_path = cwd / "terminal.txt"
    process = start_up([PIPELINE, "up"], cwd=cwd, env=env, output_path=output_path)
    up = RunningUp(process, cwd, output_path, intake_port, flower_port, ("", ""))
    try:

        def credential_shown() -> bool:
            assert process.poll() is None, up.output()
            found = re.search(CREDENTIAL, up.output())
            if found:
                up.flower_auth = (found.group(1), found.group(2))
            return found is not None

        wait_for(credential_shown, timeout_s=START_TIMEOUT_S, what="Flower's credential")
        # Over, or not within the time: the Flower test below says which.
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: flower_first_inspect_over(up),
                timeout_s=INSPECT_TIMEOUT_S,
                what="Flower's first inspect",
            )
        yield up
    finally:
        stop_up(process, up.output())


def banner_of(output: str) -> list[str]:
    """The ready banner's lines, without their `up | ` prefix."""
    lines = [line.partition(" | ")[2] for line in output.splitlines() if line.startswith("up ")]
    starts = [i for i, line in enumerate(lines) if line.startswith("==== pipeline is up")]
    assert len(starts) == 1, output
    return lines[starts[0] : starts[0] + 10]


def test_one_ready_banner_says_where_everything_is_and_that_dev_mode_is_on(running_up):
    output = running_up.output()
    banner = banner_of(output)
    intake = f"http://127.0.0.1:{running_up.intake_port}"
    assert banner[0] == "==== pipeline is up ===="  # nothing was left waiting
    text = "\n".join(banner)
    assert f"intake     {intake}\n" in text
    assert f"console    {intake}/\n" in text
    assert f"API docs   {intake}/docs\n" in text
    user, password = running_up.flower_auth
    flower = f"http://127.0.0.1:{running_up.flower_port}"
    assert f"Flower     {flower} (user {user}, password {password}; shown once)" in text
    assert "dev mode   on: unsigned requests from this machine only" in text
    log_file = running_up.cwd / ".pipeline" / "up.log"
    assert f"logs       this terminal, each line after its component's name; also {log_file}\n" in (
        text + "\n"
    )

    # Up means up: it came after every worker said it was ready, and all of it answers.
    ready = [output.index(f"{line}@") for line in LINES if f"{line}@" in output]
    assert len(ready) == len(LINES), output
    assert max(ready) < output.index("==== pipeline is up")
    assert httpx.get(f"{intake}/readyz", timeout=10).status_code == 200
    assert httpx.get(flower, auth=running_up.flower_auth, timeout=10).status_code == 200

    # The log file has the same banner, but the password is shown on the terminal only.
    logged = log_file.read_text()
    assert banner_of(logged)[1:4] == banner[1:4]
    assert password not in logged
    assert output.count(password) == 1


def test_every_line_of_pipeline_up_starts_with_its_components_name_in_one_format(running_up):
    output = running_up.output()
    prefix = re.compile(rf"^({'|'.join(map(re.escape, COMPONENTS))}) *\| (.*)$")
    seen: set[str] = set()
    for line in output.splitlines():
        found = prefix.match(line)
        assert found, f"a line without its component's name: {line!r}\n{output}"
        seen.add(found.group(1))
        # Celery's, Flower's and alembic's logs (the standard library's) look like ours.
        assert not re.match(r"(DEBUG|INFO|WARNING|ERROR) [\w.]+ ", found.group(2)), line
    assert seen == set(COMPONENTS), seen
    log_file = running_up.cwd / ".pipeline" / "up.log"
    assert all(prefix.match(line) for line in log_file.read_text().splitlines())
    # Celery's own start-up banners would say again, in ASCII art, what ours says.
    assert "[queues]" not in output
    assert "celery beat v" not in output


def test_flower_starts_once_the_workers_answer_and_inspects_them_without_a_warning(running_up):
    output = running_up.output()
    warnings = [line for line in output.splitlines() if "Inspect method" in line]
    assert warnings == []
    assert flower_knows(running_up) == {line: sorted(FIRST_INSPECT) for line in LINES}
    assert output.index("every worker answers") < output.index("flower started")
