"""The processes of a bench run, measured by PID from the kernel's counters (memory, CPU
time); they are started, waited for and stopped by `app.local.processes`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from app.threads import LoopThread

PAGE_KIB = 4


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


# The kernel's unit of CPU time in /proc/<pid>/stat.
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def parent_of(pid: int) -> int | None:
    """The parent of `pid` (from /proc); None for a process not on this host."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def cpu_s(pid: int) -> float:
    """The CPU seconds (user and system) `pid` and its living descendants have used, from
    the kernel's counters (0 for a process gone)."""
    total = 0.0
    pending = [pid]
    while pending:
        each = pending.pop()
        try:
            with open(f"/proc/{each}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # Fields 14 and 15 of stat(5), utime and stime: the 12th and 13th after the name.
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S
        pending.extend(children(each))
    return total


@dataclass
class CpuMeter:
    """The CPU seconds each of `pids` (by name; its children included) spent between the
    block's start and end, from the kernel's counters."""

    pids: dict[str, int]
    spent_s: dict[str, float] = field(default_factory=dict)
    _began: dict[str, float] = field(default_factory=dict)

    def __enter__(self) -> CpuMeter:
        self._began = {name: cpu_s(pid) for name, pid in self.pids.items()}
        return self

    def __exit__(self, *_exc: object) -> None:
        self.spent_s = {name: cpu_s(pid) - self._began[name] for name, pid in self.pids.items()}

    def ms_per(self, count: int) -> dict[str, float]:
        """Each process's CPU milliseconds per one of `count` (records, requests)."""
        return {name: round(s * 1000 / max(count, 1), 3) for name, s in self.spent_s.items()}


@dataclass
class RssSampler:
    """Samples the RSS of a process (and the largest of its children) every `interval_s`."""

    pid: int
    include_children: bool = False
    interval_s: float = 0.5
    samples: list[int] = field(default_factory=list)
    _loop: LoopThread | None = None

    def _sample(self) -> int:
        if not self.include_children:
            return rss_kib(self.pid)
        return max([rss_kib(self.pid), *(rss_kib(c) for c in children(self.pid))])

    def _step(self) -> None:
        value = self._sample()
        if value:
            self.samples.append(value)

    def __enter__(self) -> RssSampler:
        self._loop = LoopThread(self._step, name="rss", every_s=self.interval_s, delay_first=True)
        self._loop.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._loop is not None:
            self._loop.stop(timeout_s=5)

    def summary(self) -> dict[str, float]:
        """First, peak and last sample, in MiB."""
        if not self.samples:
            return {"first_mib": 0.0, "peak_mib": 0.0, "last_mib": 0.0}
        return {
            "first_mib": round(self.samples[0] / 1024, 1),
            "peak_mib": round(max(self.samples) / 1024, 1),
            "last_mib": round(self.samples[-1] / 1024, 1),
        }
