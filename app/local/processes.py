"""Child processes, one mechanism for `pipeline up`, the bench and the tests.

Each child runs in a session (so a process group) of its own, so that a terminal's Ctrl-C
reaches only its parent and the group can be killed whole; each wait is bounded; each child
is stopped by PID: a signal (SIGTERM: Celery's warm shutdown re-queues what a worker holds),
a bounded wait, then SIGKILL to its whole process group, so no pool process outlives it.
`Children` holds what one stack started and stops it together."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.local.output import Output

# How long a child may take to stop on SIGTERM before its group is killed.
STOP_TIMEOUT_S = 20.0
# How long to wait for a process to go once SIGKILL was sent to its group.
KILLED_EXIT_TIMEOUT_S = 10.0
# Between two polls of a bounded wait.
POLL_INTERVAL_S = 0.05


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts a TCP connection on `host:port` now."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_until(
    predicate: Callable[[], object],
    *,
    timeout_s: float,
    what: str,
    error: type[Exception] = TimeoutError,
) -> None:
    """Poll `predicate` until it is truthy; raise `error` (a `TimeoutError` unless given)
    naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(POLL_INTERVAL_S)
    raise error(f"timed out after {timeout_s:g}s waiting for {what}")


def wait_ready(
    process: subprocess.Popen[bytes],
    ready: Callable[[], object],
    *,
    timeout_s: float,
    what: str,
    error: type[Exception] = TimeoutError,
    exited: Callable[[int], str] | None = None,
) -> None:
    """Poll `ready` until it is truthy while `process` runs. Raises `error` after
    `timeout_s`, or as soon as the process exits (with `exited(code)` as its message)."""

    def check() -> object:
        code = process.poll()
        if code is not None:
            raise error(exited(code) if exited else f"exited with {code} before {what}")
        return ready()

    wait_until(check, timeout_s=timeout_s, what=what, error=error)


def log_file(directory: Path, name: str) -> Path:
    """The log file of the child `name` in `directory`: `<name>.log`, spaces made dashes."""
    return directory / f"{name.replace(' ', '-')}.log"


def app_cli(*args: str) -> list[str]:
    """The argument list of `pipeline ARGS...` run by this interpreter."""
    return [sys.executable, "-m", "app.cli", *args]


def group_alive(pgid: int) -> bool:
    """Whether any process is left in the process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int) -> None:
    """SIGKILL to every process left in the group `pgid` (none left: nothing happens)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def stop_process(
    process: subprocess.Popen[bytes],
    *,
    timeout_s: float,
    sig: int = signal.SIGTERM,
    signalled: bool = False,
    killed_timeout_s: float = KILLED_EXIT_TIMEOUT_S,
) -> None:
    """Stop `process`, started in a session of its own: `sig` (unless `signalled`, it was
    sent already), at most `timeout_s` to exit, then SIGKILL to what is left of its process
    group, and at most `killed_timeout_s` to reap it."""
    if process.poll() is None:
        if not signalled:
            process.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout_s)
    kill_group(process.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=killed_timeout_s)


@dataclass(eq=False)  # one process: equal to itself only, and hashable
class Child:
    """A child process `argv`, in a session of its own, stopped by PID."""

    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    # Where its output goes (appended); None: our own stdout and stderr (or `output`).
    log_path: Path | None = None
    # Its working directory; None: ours.
    cwd: Path | None = None
    # Its environment when `start` is given none; None: ours.
    env: dict[str, str] | None = None
    # Whether the stop signal was sent: a second SIGTERM hurries a Celery worker's warm
    # shutdown.
    signalled: bool = False

    def start(self, env: dict[str, str] | None = None, *, output: Output | None = None) -> Child:
        """Start it, with `env` (default: its own `env`); with `output`, its lines go there
        after its name."""
        if self.process is not None and self.process.poll() is None:
            # A second process under one name would leave the first with no one to stop it.
            raise RuntimeError(f"{self.name} is running already (pid {self.process.pid})")
        env = self.env if env is None else env
        self.signalled = False
        if output is not None:
            self.process = subprocess.Popen(  # noqa: S603 - argument lists of our own
                self.argv,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            assert self.process.stdout is not None
            output.pump(self.name, self.process.stdout)
        elif self.log_path is None:
            self.process = subprocess.Popen(  # noqa: S603 - argument lists of our own
                self.argv, env=env, cwd=self.cwd, start_new_session=True
            )
        else:
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(  # noqa: S603 - argument lists of our own
                    self.argv,
                    env=env,
                    cwd=self.cwd,
                    start_new_session=True,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was not started"
        return self.process.pid

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def output(self) -> str:
        """What it wrote to its log file so far ("" with none)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def wait_for_output(
        self, text: str, *, timeout_s: float = 30, error: type[Exception] = TimeoutError
    ) -> None:
        """Wait until `text` is in its log file. Raises `error` after `timeout_s`, or as
        soon as it exits (with the end of its output)."""
        assert self.process is not None, f"{self.name} was not started"
        wait_ready(
            self.process,
            lambda: text in self.output(),
            timeout_s=timeout_s,
            what=f"{text!r} from {self.name}",
            error=error,
            exited=lambda _code: f"{self.name} exited early:\n{self.output()[-3000:]}",
        )

    def ask_to_stop(self, sig: int = signal.SIGTERM) -> None:
        """Send `sig` once, without waiting (`stop` waits, then kills what is left)."""
        process = self.process
        if process is not None and process.poll() is None and not self.signalled:
            process.send_signal(sig)
            self.signalled = True

    def stop(self, *, timeout_s: float = STOP_TIMEOUT_S, sig: int = signal.SIGTERM) -> None:
        """`sig` (unless `ask_to_stop` sent it), at most `timeout_s` to exit, then SIGKILL
        to its whole process group."""
        if self.process is None:
            return
        self.ask_to_stop(sig)
        stop_process(self.process, timeout_s=timeout_s, signalled=True)


def stop_all(children: Sequence[Child], *, timeout_s: float, shared: bool = False) -> None:
    """Ask every one of `children` to stop at once (their shutdowns overlap), then stop
    each, the last started first: each given `timeout_s` to exit or, when `shared`, all of
    them `timeout_s` together, before its process group is killed."""
    ordered = list(reversed(children))
    for child in ordered:
        child.ask_to_stop()
    deadline = time.monotonic() + timeout_s
    for child in ordered:
        child.stop(timeout_s=max(0.0, deadline - time.monotonic()) if shared else timeout_s)


@dataclass
class Children:
    """The processes one stack started (`pipeline up`'s, a bench run's, a test's), each in a
    session of its own, its output to `output` or to a log file in `log_dir`, stopped
    together by PID (`stop_all`)."""

    env: dict[str, str]
    # Where each child's log file goes (`<name>.log`); None: see `output`.
    log_dir: Path | None = None
    # Where each child's lines go, after its name, when there is no `log_dir`.
    output: Output | None = None
    cwd: Path | None = None
    started: list[Child] = field(default_factory=list)

    def start(
        self,
        name: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> Child:
        """Start `argv` as `name`, with `env` (default: the stack's), its output to
        `log_path` (default: `<log_dir>/<name>.log`, spaces made dashes)."""
        if log_path is None and self.log_dir is not None:
            log_path = log_file(self.log_dir, name)
        child = Child(name, argv, log_path=log_path, cwd=self.cwd)
        return self.add(child, env=self.env if env is None else env)

    def add(self, child: Child, *, env: dict[str, str] | None = None) -> Child:
        """Start `child` (made by the caller), with `env` (default: its own), as one of
        these."""
        # Listed before it starts: a start that fails half-way is still stopped.
        self.started.append(child)
        child.start(env, output=None if child.log_path else self.output)
        return child

    def stop(self, child: Child, *, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop `child` and forget it."""
        child.stop(timeout_s=timeout_s)
        self.started.remove(child)

    def exited(self) -> tuple[Child, int] | None:
        """A child that has exited, with its exit code; None while all run."""
        for child in self.started:
            code = child.exit_code()
            if code is not None:
                return child, code
        return None

    def stop_all(self, *, timeout_s: float = STOP_TIMEOUT_S, shared: bool = False) -> None:
        """Stop every child (see `stop_all`) and forget them."""
        stop_all(self.started, timeout_s=timeout_s, shared=shared)
        self.started.clear()
