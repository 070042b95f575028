"""Processes of a bench run: started, waited for and measured by PID."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PAGE_KIB = 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Callable[[], object], *, timeout_s: float, what: str) -> None:
    """Poll `predicate` until truthy; raise `TimeoutError` naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def rss_kib(pid: int) -> int:
    """Resident set size of `pid` in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE_KIB
    except (OSError, IndexError, ValueError):
        return 0


def children(pid: int) -> list[int]:
    """The direct children of `pid` (from /proc)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


@dataclass
class RssSampler:
    """Samples the RSS of a process (and the largest of its children) every `interval_s`."""

    pid: int
    include_children: bool = False
    interval_s: float = 0.5
    samples: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _sample(self) -> int:
        if not self.include_children:
            return rss_kib(self.pid)
        return max([rss_kib(self.pid), *(rss_kib(c) for c in children(self.pid))])

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            value = self._sample()
            if value:
                self.samples.append(value)

    def __enter__(self) -> RssSampler:
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def summary(self) -> dict[str, float]:
        """First, peak and last sample, in MiB."""
        if not self.samples:
            return {"first_mib": 0.0, "peak_mib": 0.0, "last_mib": 0.0}
        return {
            "first_mib": round(self.samples[0] / 1024, 1),
            "peak_mib": round(max(self.samples) / 1024, 1),
            "last_mib": round(self.samples[-1] / 1024, 1),
        }


def log_path(workdir: Path, name: str) -> Path:
    return workdir / f"{name.replace(' ', '-')}.log"
