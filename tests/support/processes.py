"""Processes the tests start and stop by PID, with bounded waits: the product's own helper
(`app.local.processes`), with a test's way of failing (an `AssertionError`), and the
helpers that drive `pipeline up` from outside."""

from __future__ import annotations

import re
import signal
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from app.local.processes import (
    KILLED_EXIT_TIMEOUT_S,
    Child,
    app_cli,
    free_port,
    group_alive,
    kill_group,
    stop_process,
    wait_until,
)

__all__ = [
    "KILLED_EXIT_TIMEOUT_S",
    "REPO",
    "STOP_TIMEOUT_S",
    "TLS_CONTEXT",
    "Component",
    "free_port",
    "group_alive",
    "run_until_exit",
    "start_up",
    "stop_up",
    "wait_for",
]

REPO = Path(__file__).resolve().parents[2]
# How long `run_until_exit` lets a process stop on SIGTERM before it kills its group.
STOP_TIMEOUT_S = 60
# How long `stop_up` lets `pipeline up` stop what it started on Ctrl-C.
UP_STOP_TIMEOUT_S = 60
# For httpx's one-call functions (httpx.get, httpx.request, ...) in loops, as `verify=`:
# without it each call builds a TLS context and loads the CA bundle, about 60 ms of CPU,
# even for plain http:// (a readiness poll every 50 ms took a core). Made once, here.
TLS_CONTEXT = ssl.create_default_context()


def wait_for(predicate: Callable[[], object], *, timeout_s: float, what: str) -> None:
    """Poll `predicate` until it is truthy; fail the test after `timeout_s`."""
    wait_until(predicate, timeout_s=timeout_s, what=what, error=AssertionError)


class Component(Child):
    """A `python -m app.cli ARGS...` child process, run from the checkout with `env`, its
    output in the file `log_path`; its waits fail the test."""

    def __init__(self, args: list[str], *, env: dict[str, str], log_path: Path) -> None:
        super().__init__(" ".join(args), app_cli(*args), log_path=log_path, cwd=REPO, env=env)
        self.args = args

    def start(self, env: dict[str, str] | None = None, **_: object) -> Component:
        super().start(env)
        return self

    def wait_for_output(
        self, text: str, *, timeout_s: float = 30, error: type[Exception] = AssertionError
    ) -> None:
        super().wait_for_output(text, timeout_s=timeout_s, error=error)


def start_up(
    argv: list[str], *, cwd: Path, env: dict[str, str], output_path: Path
) -> subprocess.Popen[bytes]:
    """Start `argv` (a `pipeline up`) in `cwd`, in a session of its own, what it writes to
    its terminal in `output_path`; `stop_up` stops it."""
    up = Child("up", argv, log_path=output_path, cwd=cwd, env=env).start()
    assert up.process is not None
    return up.process


def stop_up(process: subprocess.Popen[bytes], output: str) -> None:
    """Stop a `pipeline up` started as `process`: Ctrl-C (SIGINT), at most a minute to stop
    what it started, else its group killed; then any group of its children that `output`
    names (`(pid N)`) and that is still alive, killed."""
    pids = {int(pid) for pid in re.findall(r"\(pid (\d+)\)", output)}
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=UP_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_group(process.pid)
            process.wait(timeout=KILLED_EXIT_TIMEOUT_S)
    for pid in pids:
        if group_alive(pid):
            kill_group(pid)


def run_until_exit(
    argv: list[str], *, env: dict[str, str], cwd: Path, timeout_s: float
) -> tuple[int | None, str]:
    """Run `argv` in `cwd` until it exits or `timeout_s` passes; then it is asked to stop
    (SIGTERM: `pipeline up` stops its children, which are in process groups of their own),
    and its process group is killed. Returns its exit code (None: it was still running)
    and its stderr."""
    err_path = cwd / f"stderr-{time.monotonic_ns()}.txt"
    with err_path.open("wb") as err:
        process = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
    try:
        code: int | None = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        stop_process(process, timeout_s=STOP_TIMEOUT_S)
    return code, err_path.read_text(errors="replace")
