"""A real HTTP load balancer in front of several intakes: Debian's `haproxy`, started by a
test with a generated configuration on free loopback ports, round-robin over its
backends, and its statistics (what each backend answered) read from its CSV page."""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
from pathlib import Path

import httpx

from app.local.processes import Child, wait_ready
from tests.support.processes import free_port
from tests.support.services import require

# Where Debian installs it; root's PATH has /usr/sbin, a user's may not.
DEBIAN_PATH = "/usr/sbin/haproxy"
# The answer classes haproxy counts per backend server.
ANSWER_CLASSES = ("hrsp_1xx", "hrsp_2xx", "hrsp_3xx", "hrsp_4xx", "hrsp_5xx", "hrsp_other")

CONFIG = """\
global
    maxconn 2048

defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 5s

frontend intake
    bind 127.0.0.1:{port}
    default_backend intakes

backend intakes
    balance roundrobin
    option httpchk GET /healthz
{servers}

frontend stats
    bind 127.0.0.1:{stats_port}
    stats enable
    stats uri /stats
"""


def haproxy_binary() -> str:
    """The `haproxy` to run; skips the test (fails it in CI) when there is none."""
    found = shutil.which("haproxy") or (DEBIAN_PATH if os.access(DEBIAN_PATH, os.X_OK) else None)
    require(found, "haproxy is not installed (Debian: apt-get install haproxy)")
    assert found is not None
    return found


class LoadBalancer:
    """haproxy on a free loopback port, round-robin over `backends` (base URLs of the form
    http://127.0.0.1:PORT), checking each with GET /healthz."""

    def __init__(self, backends: list[str], *, workdir: Path) -> None:
        self.binary = haproxy_binary()
        self.port = free_port()
        self.stats_port = free_port()
        self.names = [f"intake{n}" for n in range(1, len(backends) + 1)]
        servers = "\n".join(
            f"    server {name} {url.removeprefix('http://')} check inter 500ms"
            for name, url in zip(self.names, backends, strict=True)
        )
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "haproxy.cfg"
        self.config_path.write_text(
            CONFIG.format(port=self.port, stats_port=self.stats_port, servers=servers)
        )
        self.log_path = workdir / "haproxy.log"
        self.child = Child(
            "haproxy", [self.binary, "-db", "-f", str(self.config_path)], log_path=self.log_path
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, timeout_s: float = 20) -> LoadBalancer:
        """Start it and wait until every backend is UP."""
        check = subprocess.run(
            [self.binary, "-c", "-f", str(self.config_path)],
            capture_output=True,
            check=False,
            timeout=30,
        )
        assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
        self.child.start()
        assert self.child.process is not None
        wait_ready(
            self.child.process,
            self._all_up,
            timeout_s=timeout_s,
            what="haproxy to see every intake up",
            error=AssertionError,
            exited=lambda _code: f"haproxy exited early:\n{self.child.output()}",
        )
        return self

    def _all_up(self) -> bool:
        try:
            rows = self.stats()
        except httpx.HTTPError:
            return False
        return all(rows.get(name, {}).get("status") == "UP" for name in self.names)

    def stats(self) -> dict[str, dict[str, str]]:
        """The CSV statistics of the backend's servers, by server name."""
        answer = httpx.get(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=5)
        answer.raise_for_status()
        reader = csv.DictReader(io.StringIO(answer.text.removeprefix("# ")))
        return {
            row["svname"]: row
            for row in reader
            if row["pxname"] == "intakes" and row["svname"] in self.names
        }

    def answered(self) -> dict[str, int]:
        """How many HTTP answers each backend server has given through the proxy so far
        (its health checks are not counted)."""
        return {
            name: sum(int(row[field] or 0) for field in ANSWER_CLASSES)
            for name, row in self.stats().items()
        }

    def stop(self, *, timeout_s: float = 10) -> None:
        self.child.stop(timeout_s=timeout_s)
