"""`pipeline up`: the whole stack as child processes of one foreground command.

Before anything starts, its ports are checked (`app.local.ports`), and a Redis that answers
at the URL, which it did not start, is said so on stderr and refused when its database holds
another application's keys, unless told to share it (`app.local.shared_redis`). Then, in
order: the embedded Redis (when nothing answers at the URL), the journal's migrations, the
intake, one worker per line and beat; Flower once every worker answers a ping (its first
inspect would otherwise find none and warn); and one ready banner once all of them answer.
Every child's output comes back through a pipe, each line after the child's name
(`app.local.output`), to the terminal and to one log file.

Each child runs in its own session (so a terminal's Ctrl-C reaches only us) and is stopped
by PID: SIGTERM (Celery's warm shutdown re-queues what a worker holds), then SIGKILL to its
whole process group, so no pool process outlives it (`app.local.processes`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from redis import RedisError
from sqlalchemy.engine import make_url

from app.config.redis import masked_url
from app.config.settings import Settings
from app.errors import BrokerUnavailable, ConfigError
from app.local.banner import Banner, http_url
from app.local.embedded_redis import RedisServer, answers
from app.local.flower import generated_basic_auth
from app.local.output import SUPERVISOR, Output
from app.local.ports import check_ports, ports_of
from app.local.processes import STOP_TIMEOUT_S, Child, Children, app_cli
from app.local.readiness import http_answers, worker_nodename, workers_answering
from app.local.shared_redis import foreign_keys, refusal

# How long the migrations may take before `pipeline up` gives up.
MIGRATE_TIMEOUT_S = 300.0
# How long the components may take to answer before the banner comes anyway, naming them.
# A cold start on a small machine takes ~30 s.
READY_TIMEOUT_S = 180.0
# Between two rounds of probes while starting, and two looks at the children once up.
POLL_INTERVAL_S = 0.2
# The log file of `pipeline up`, in its working directory: this run's lines, no secrets.
LOG_NAME = "up.log"


class StartFailed(Exception):
    """A component died, or Ctrl-C came, before the stack was up."""


@dataclass
class Stack:
    """The children of `pipeline up` and the embedded Redis, if we started one."""

    settings: Settings
    workdir: Path
    output: Output
    redis: RedisServer | None = None
    stopping: bool = False
    # The children's environment: ours, and what `start` adds.
    base_env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    children: Children = field(init=False)

    def __post_init__(self) -> None:
        # Each child gets `env` as it is when it starts (`start` adds Flower's credentials).
        self.children = Children(env={}, output=self.output)

    def say(self, text: str) -> None:
        self.output.line(SUPERVISOR, text)

    def _spawn(self, name: str, *args: str) -> Child:
        child = self.children.start(name, app_cli(*args), env=self.env)
        self.say(f"{name} started (pid {child.pid})")
        return child

    def _check_children(self) -> None:
        if self.stopping:
            raise StartFailed("stopped before the stack was up")
        exited = self.children.exited()
        if exited is not None:
            child, code = exited
            raise StartFailed(f"{child.name} exited with {code}")

    @property
    def env(self) -> dict[str, str]:
        # Children write to a pipe: unbuffered, their lines come as they are written.
        return self.base_env | {"PYTHONUNBUFFERED": "1"}

    def start(self) -> None:
        """Start everything and print the banner. Raises `StartFailed`."""
        shown = masked_url(self.settings.redis_url)
        if self.redis is not None:
            self.redis.start(on_output=lambda stream: self.output.pump("redis", stream))
            self.say(f"redis embedded server at {shown} (pid {self.redis.pid})")
            redis_said = f"embedded at {shown}: in memory, gone when this stops"
        else:
            self.say(f"redis: {not_ours_notice(self.settings.redis_url)}")
            redis_said = f"{shown}: NOT started by pipeline up, shared with whatever else uses it"
        self._migrate()
        flower_auth = self.settings.flower_basic_auth
        if flower_auth is None:
            credentials = generated_basic_auth()
            self.base_env["PIPELINE_FLOWER_BASIC_AUTH"] = credentials
        else:
            credentials = flower_auth.get_secret_value()
        self._spawn("intake", "intake")
        for line in self.settings.lines:
            # The banner below says what Celery's would.
            self._spawn(f"worker-{line}", "worker", line, "--quiet")
        self._spawn("beat", "beat", "--quiet")
        missing = self._wait_for_workers()
        self._spawn("flower", "flower")
        missing += self._wait_for_servers()

        intake = http_url(self.settings.intake_host, self.settings.intake_port)
        user, _, password = credentials.partition(":")
        banner = Banner(
            intake_url=intake,
            flower_url=http_url(self.settings.flower_host, self.settings.flower_port),
            flower_user=user,
            flower_password=password if flower_auth is None else None,
            dev_mode=self.settings.in_dev_mode,
            log_path=self.output_path,
            redis=redis_said,
            journal=make_url(self.settings.database_url).render_as_string(hide_password=True),
            not_answering=tuple(missing),
        )
        self.output.show_once(
            SUPERVISOR, banner.lines(show_secret=True), banner.lines(show_secret=False)
        )

    def _migrate(self) -> None:
        """Run the journal's migrations (`pipeline db upgrade`) to the end."""
        # Stopped with the others if it hangs.
        migrate = self.children.start("migrate", app_cli("db", "upgrade"), env=self.env)
        assert migrate.process is not None
        try:
            code = migrate.process.wait(timeout=MIGRATE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise StartFailed(f"the migrations took over {MIGRATE_TIMEOUT_S:.0f} s") from None
        self.children.stop(migrate)  # it has exited: forgotten
        if code != 0:
            raise StartFailed(f"the migrations failed (exit {code})")

    @property
    def output_path(self) -> Path:
        return self.workdir / LOG_NAME

    def _wait_for_workers(self) -> list[str]:
        """Wait until every line's worker answers a ping; the names of those that did not."""
        from app.celery_app import create_celery  # noqa: PLC0415 - Celery for `up` only

        names = {worker_nodename(line): f"worker-{line}" for line in self.settings.lines}
        answered: set[str] = set()
        celery = create_celery(self.settings)
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while time.monotonic() < deadline:
                self._check_children()
                answered |= workers_answering(celery, set(names) - answered)
                if answered >= set(names):
                    self.say("every worker answers: starting Flower")
                    return []
                time.sleep(POLL_INTERVAL_S)
        finally:
            celery.close()
        late = sorted(names[name] for name in set(names) - answered)
        self.say(f"no answer in {READY_TIMEOUT_S:.0f} s from {', '.join(late)}; starting Flower")
        return late

    def _wait_for_servers(self) -> list[str]:
        """Wait until the intake is ready and Flower answers; the names of those that did not."""
        probes = {
            "intake": http_url(self.settings.intake_host, self.settings.intake_port, "/readyz"),
            "flower": http_url(self.settings.flower_host, self.settings.flower_port, "/"),
        }
        deadline = time.monotonic() + READY_TIMEOUT_S
        while probes and time.monotonic() < deadline:
            self._check_children()
            probes = {name: url for name, url in probes.items() if not http_answers(url)}
            if probes:
                time.sleep(POLL_INTERVAL_S)
        return sorted(probes)

    def wait(self) -> int:
        """Block until a signal asks us to stop or a child dies; returns the exit code."""
        while not self.stopping:
            exited = self.children.exited()
            if exited is not None:
                child, code = exited
                self.say(f"{child.name} exited with {code}; stopping")
                return 1
            time.sleep(POLL_INTERVAL_S)
        return 0

    def stop(self) -> None:
        # All are asked at once, so that their shutdowns overlap.
        self.children.stop_all(timeout_s=STOP_TIMEOUT_S)
        if self.redis is not None:
            self.redis.stop()


def not_ours_notice(url: str) -> str:
    """What `pipeline up` says, loudly, of a Redis it did not start."""
    return (
        f"using a Redis that pipeline up did NOT start, at {masked_url(url)}: its data and "
        "its life are another's (stopping pipeline up does not stop it)"
    )


def check_shared_redis(settings: Settings, *, shared: bool) -> None:
    """Before using a Redis it did not start: refuse (`ConfigError`) a database that holds
    another application's keys unless `shared`, and say on stderr whose Redis it uses."""
    url = settings.redis_url
    if not shared:
        try:
            found = foreign_keys(url, settings.lines)
        except RedisError as exc:
            raise BrokerUnavailable(f"redis at {masked_url(url)}: {exc}") from exc
        if found.count:
            raise ConfigError(refusal(url, found))
    shared_said = " (shared knowingly: --share-redis or PIPELINE_REDIS_SHARED)" if shared else ""
    print(f"pipeline up: warning: {not_ours_notice(url)}{shared_said}", file=sys.stderr)


def run_stack(
    settings: Settings, *, workdir: Path, notices: list[str], share_redis: bool = False
) -> int:
    """Run the stack in the foreground until SIGINT or SIGTERM. Raises `ConfigError`, before
    starting anything, when one of its ports is taken, or when a Redis it did not start
    holds another application's keys and `share_redis` (or `PIPELINE_REDIS_SHARED`) is not
    set."""
    redis = None
    if answers(settings.redis_url):
        check_shared_redis(settings, shared=share_redis or settings.redis_shared)
    else:
        redis = RedisServer.for_url(settings.redis_url, workdir=workdir)
    check_ports(ports_of(settings, embedded_redis_port=None if redis is None else redis.port))

    workdir.mkdir(parents=True, exist_ok=True)
    names = ["redis", "migrate", "intake", "beat", "flower"]
    names += [f"worker-{line}" for line in settings.lines]
    output = Output(
        terminal=sys.stdout,
        log_file=(workdir / LOG_NAME).open("w", encoding="utf-8"),
        names=names,
    )
    stack = Stack(settings=settings, workdir=workdir, output=output, redis=redis)

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stack.stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    for notice in notices:
        stack.say(notice)
    code = 0
    try:
        stack.start()
        code = stack.wait()
    except StartFailed as exc:
        stack.say(f"not started: {exc}")
        code = 0 if stack.stopping else 1
    finally:
        stack.say("stopping...")
        stack.stop()
        output.drain(timeout_s=2.0)
        stack.say("stopped")
        output.close()
    return code
