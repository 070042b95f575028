"""`pipeline up`: the whole stack as child processes of one foreground command.

Each child runs in its own session (so a terminal's Ctrl-C reaches only us) and is stopped
by PID: SIGTERM (Celery's warm shutdown re-queues what a worker holds), then SIGKILL to its
whole process group, so no pool process outlives it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from app.journal.engine import make_engine
from app.journal.schema import upgrade
from app.local.embedded_redis import RedisServer, answers
from app.local.flower import generated_basic_auth
from app.redis_client import masked_url
from app.settings import Settings

STOP_TIMEOUT_S = 20.0


@dataclass
class Child:
    """A component process."""

    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    # Where its output goes; None: our own stdout and stderr.
    log_path: Path | None = None

    def start(self, env: dict[str, str]) -> None:
        if self.log_path is None:
            self.process = subprocess.Popen(self.argv, env=env, start_new_session=True)  # noqa: S603
            return
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603
                self.argv, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT
            )

    def stop(self, *, timeout_s: float) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # anything left in its group
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout_s)


@dataclass
class Stack:
    """The children of `pipeline up` and the embedded Redis, if we started one."""

    settings: Settings
    workdir: Path
    children: list[Child] = field(default_factory=list)
    redis: RedisServer | None = None
    stopping: bool = False

    def _component(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "app.cli", *args]

    def start(self) -> None:
        shown = masked_url(self.settings.redis_url)
        if not answers(self.settings.redis_url):
            self.redis = RedisServer.for_url(self.settings.redis_url, workdir=self.workdir)
            self.redis.start()
            print(f"redis     embedded server at {shown} (pid {self.redis.pid})")
        else:
            print(f"redis     using the server at {shown}")
        engine = make_engine(self.settings.database_url)
        try:
            upgrade(engine)
        finally:
            engine.dispose()
        print(f"journal   migrated: {engine.url.render_as_string(hide_password=True)}")
        self.children.append(Child("intake", self._component("intake")))
        for line in self.settings.lines:
            self.children.append(Child(f"worker {line}", self._component("worker", line)))
        self.children.append(Child("beat", self._component("beat")))
        self.children.append(Child("flower", self._component("flower")))
        env = dict(os.environ)
        flower_auth = self.settings.flower_basic_auth
        if flower_auth is None:
            credentials = generated_basic_auth()
            env["PIPELINE_FLOWER_BASIC_AUTH"] = credentials
        else:
            credentials = flower_auth.get_secret_value()
        for child in self.children:
            child.start(env)
            assert child.process is not None
            print(f"{child.name:<9} started (pid {child.process.pid})")
        host = "127.0.0.1" if self.settings.in_dev_mode else self.settings.intake_host
        print(f"intake    listening on http://{host}:{self.settings.intake_port}")
        flower_url = f"http://{self.settings.flower_host}:{self.settings.flower_port}"
        if flower_auth is None:
            user, _, password = credentials.partition(":")
            print(f"flower    {flower_url} (user {user}, password {password}; shown once)")
        else:
            print(f"flower    {flower_url} (PIPELINE_FLOWER_BASIC_AUTH)")

    def wait(self) -> int:
        """Block until a signal asks us to stop or a child dies; returns the exit code."""
        while not self.stopping:
            for child in self.children:
                if child.process is not None and child.process.poll() is not None:
                    print(f"{child.name} exited with {child.process.returncode}; stopping")
                    return 1
            time.sleep(0.2)
        return 0

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop(timeout_s=STOP_TIMEOUT_S)
        if self.redis is not None:
            self.redis.stop()


def run_stack(settings: Settings, *, workdir: Path) -> int:
    """Run the stack in the foreground until SIGINT or SIGTERM."""
    stack = Stack(settings=settings, workdir=workdir)

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stack.stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        stack.start()
        code = stack.wait()
    finally:
        print("stopping...")
        stack.stop()
        print("stopped")
    return code
