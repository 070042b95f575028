"""A Redis primary, one replica and three sentinels on loopback free ports, started and
stopped by PID: Debian's `redis-server`, in Sentinel mode for the sentinels.

A test can stop replication at a moment of its choosing (`lag()`): the replica is
stopped (SIGSTOP) and its link cut on the primary's side, so what the primary takes after
that is what a replica that lagged never got. `kill_primary()` kills the primary, then lets
the replica go on, in time for Sentinel to promote it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from app.local.processes import Child, stop_process
from tests.support.processes import free_port, wait_for
from tests.support.services import require

MASTER = "pipeline"
# Sentinel's failure detection: a primary silent this long is down (quorum 2 of 3). Short,
# so a failover takes a few seconds instead of Sentinel's default 30 s.
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


def sentinel_binary() -> str:
    """`redis-server` (it runs as a sentinel with `--sentinel`), or the test is skipped
    (failed in CI)."""
    found = shutil.which("redis-server")
    require(found, "redis-server is not installed (Debian's redis-server package)")
    assert found is not None
    return found


def _answers(port: int) -> bool:
    client = redis.Redis(port=port, socket_connect_timeout=0.5, socket_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


@dataclass
class SentinelSet:
    workdir: Path
    binary: str = field(default_factory=sentinel_binary)
    primary_port: int = field(default_factory=free_port)
    replica_port: int = field(default_factory=free_port)
    sentinel_ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(3)])
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"sentinel://{hosts}/0?master={MASTER}"

    def _start(self, name: str, args: list[str]) -> None:
        log_path = self.workdir / f"{name}.log"
        log_path.unlink(missing_ok=True)  # a restarted one writes its log afresh
        child = Child(name, [self.binary, *args], log_path=log_path, cwd=self.workdir).start()
        assert child.process is not None
        self.processes[name] = child.process

    def _server_args(self, port: int) -> list[str]:
        return ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]

    def start(self) -> SentinelSet:
        """Start them all and wait until every sentinel knows the replica and the two other
        sentinels (a failover needs both)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._start("primary", self._server_args(self.primary_port))
        wait_for(lambda: _answers(self.primary_port), timeout_s=20, what="the primary")
        self._start(
            "replica",
            [
                *self._server_args(self.replica_port),
                "--replicaof",
                "127.0.0.1",
                str(self.primary_port),
            ],
        )
        for n, port in enumerate(self.sentinel_ports):
            conf = self.workdir / f"sentinel-{n}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {self.primary_port} 2\n"
                f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
            self._start(f"sentinel-{n}", [str(conf), "--sentinel"])
        wait_for(self._all_know_each_other, timeout_s=30, what="the sentinels to meet")
        return self

    def _master_state(self, port: int) -> dict[str, str]:
        client = redis.Redis(port=port, socket_timeout=1, decode_responses=True)
        try:
            state: dict[str, str] = client.execute_command("SENTINEL", "MASTER", MASTER)
            return state
        finally:
            client.close()

    def _all_know_each_other(self) -> bool:
        try:
            states = [self._master_state(port) for port in self.sentinel_ports]
        except redis.RedisError:
            return False
        return (
            all(int(s["num-other-sentinels"]) >= 2 and int(s["num-slaves"]) >= 1 for s in states)
            and self._replica_in_sync()
        )

    def _replica_in_sync(self) -> bool:
        client = redis.Redis(port=self.replica_port, socket_timeout=1, decode_responses=True)
        try:
            return client.info("replication").get("master_link_status") == "up"
        except redis.RedisError:
            return False
        finally:
            client.close()

    def primary_port_now(self) -> int | None:
        """The primary's port as a majority of the sentinels name it (None: no majority)."""
        named: list[int] = []
        for port in self.sentinel_ports:
            client = redis.Redis(port=port, socket_timeout=1)
            try:
                answer = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
                named.append(int(answer[1]))
            except (redis.RedisError, TypeError, IndexError):
                continue
            finally:
                client.close()
        for port in set(named):
            if named.count(port) >= 2:
                return port
        return None

    def replica_has(self, key: bytes) -> bool:
        client = redis.Redis(port=self.replica_port, socket_timeout=1)
        try:
            return bool(client.exists(key))
        except redis.RedisError:
            return False
        finally:
            client.close()

    def lag(self) -> None:
        """The replica stops getting the primary's writes (neither side is told)."""
        self.processes["replica"].send_signal(signal.SIGSTOP)
        client = redis.Redis(port=self.primary_port, socket_timeout=2)
        try:
            client.execute_command("CLIENT", "KILL", "TYPE", "replica")
        finally:
            client.close()

    def kill_primary(self) -> None:
        """Kill the primary (-9); a replica stopped by `lag()` goes on."""
        process = self.processes["primary"]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        self.processes["replica"].send_signal(signal.SIGCONT)

    def wait_for_promotion(self, *, timeout_s: float) -> float:
        """Wait until a majority of the sentinels name the replica and it answers as a
        primary; returns the monotonic time it was first seen so."""

        def promoted() -> bool:
            if self.primary_port_now() != self.replica_port:
                return False
            client = redis.Redis(port=self.replica_port, socket_timeout=1, decode_responses=True)
            try:
                return client.info("replication").get("role") == "master"
            except redis.RedisError:
                return False
            finally:
                client.close()

        wait_for(promoted, timeout_s=timeout_s, what="Sentinel to promote the replica")
        return time.monotonic()

    def stop(self) -> None:
        for process in self.processes.values():
            # SIGKILL: a stopped one (`lag()`) goes too.
            stop_process(process, timeout_s=10, sig=signal.SIGKILL)
