"""Processes the tests start and stop by PID, with bounded waits."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# How long to wait for a process group to go once SIGKILL was sent to it.
KILLED_EXIT_TIMEOUT_S = 10
# How long `run_until_exit` lets a process stop on SIGTERM before it kills its group.
STOP_TIMEOUT_S = 60
# For httpx's one-call functions (httpx.get, httpx.request, ...) in loops, as `verify=`:
# without it each call builds a TLS context and loads the CA bundle, about 60 ms of CPU,
# even for plain http:// (a readiness poll every 50 ms took a core). Made once, here.
TLS_CONTEXT = ssl.create_default_context()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Callable[[], object], *, timeout_s: float, what: str) -> None:
    """Poll `predicate` until it is truthy; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class Component:
    """A `python -m app.cli ...` child process with its output in a file."""

    def __init__(self, args: list[str], *, env: dict[str, str], log_path: Path) -> None:
        self.args = args
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.signalled = False

    def start(self) -> Component:
        self.signalled = False
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", *self.args],
            env=self.env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for_output(self, text: str, *, timeout_s: float = 30) -> None:
        def seen() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"{self.args} exited early:\n{self.output()[-3000:]}")
            return text in self.output()

        wait_for(seen, timeout_s=timeout_s, what=f"{text!r} from {self.args}")

    def ask_to_stop(self, sig: int = signal.SIGTERM) -> None:
        """Ask the process to stop, without waiting (see `stop`)."""
        process = self.process
        if process is not None and process.poll() is None and not self.signalled:
            process.send_signal(sig)
            self.signalled = True

    def stop(self, *, sig: int = signal.SIGTERM, timeout_s: float = 20) -> None:
        """Signal the process (unless `ask_to_stop` did), wait, then SIGKILL its whole group."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            self.ask_to_stop(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=KILLED_EXIT_TIMEOUT_S)


def group_alive(pgid: int) -> bool:
    """Whether any process is left in the process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_up(process: subprocess.Popen[bytes], output: str) -> None:
    """Stop a `pipeline up` started as `process`: Ctrl-C (SIGINT), at most a minute to stop
    what it started, else its group killed; then any group of its children that `output`
    names (`(pid N)`) and that is still alive, killed."""
    pids = {int(pid) for pid in re.findall(r"\(pid (\d+)\)", output)}
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=KILLED_EXIT_TIMEOUT_S)
    for pid in pids:
        if group_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


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
        if process.poll() is None:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=KILLED_EXIT_TIMEOUT_S)
    return code, err_path.read_text(errors="replace")
