"""Hosts in network namespaces, made and removed by a test: a bridge in the root namespace
with an address (where the shared services listen), and one namespace per host joined to
the bridge by a veth pair. A host's link is cut by setting its veth down: its packets are
dropped, and no connection of it is told. Every name carries a tag unique to the run, and
the subnet is a free 10.213.x.0/24. Needs root and iproute2's `ip`."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.processes import Component

# How long one `ip` command may take before the test gives up on it.
IP_TIMEOUT_S = 10
# The private range the subnets are taken from: 10.213.x.0/24, x free on this machine.
SUBNET_PREFIX = "10.213"


def missing() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "hosts in network namespaces need root (ip netns, veth pairs, a bridge)"
    if shutil.which("ip") is None:
        return "hosts in network namespaces need iproute2's `ip`"
    return None


def _ip_binary() -> str:
    found = shutil.which("ip")
    assert found is not None, missing()
    return found


def ip(*args: str) -> str:
    """Run `ip ARGS`; raises CalledProcessError (with its stderr) or TimeoutExpired."""
    done = subprocess.run(
        [_ip_binary(), *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise subprocess.CalledProcessError(
            done.returncode, done.args, output=done.stdout, stderr=done.stderr
        )
    return done.stdout


def free_subnet() -> str:
    """A `10.213.x` no address or route of this machine uses."""
    used = ip("-4", "-o", "addr", "show") + ip("-4", "route", "show", "table", "all")
    choices = list(range(1, 255))
    random.shuffle(choices)
    for x in choices:
        if f"{SUBNET_PREFIX}.{x}." not in used:
            return f"{SUBNET_PREFIX}.{x}"
    raise AssertionError(f"no free {SUBNET_PREFIX}.x.0/24 on this machine")


@dataclass(frozen=True, kw_only=True)
class Host:
    name: str
    namespace: str
    veth: str  # the end in the root namespace, on the bridge: set down to cut the link
    peer: str  # the end inside the namespace
    address: str


@dataclass
class Network:
    """A bridge and one namespace per host name; `create()`, then `remove()` (always)."""

    names: tuple[str, ...]
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    hosts: dict[str, Host] = field(default_factory=dict)
    bridge: str = ""
    address: str = ""
    _undo: list[tuple[str, ...]] = field(default_factory=list)

    def create(self) -> Network:
        subnet = free_subnet()
        # Interface names have at most 15 characters.
        self.bridge = f"plbr{self.tag}"
        self.address = f"{subnet}.1"
        ip("link", "add", self.bridge, "type", "bridge")
        self._undo.append(("link", "del", self.bridge))
        ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for n, name in enumerate(self.names):
            host = Host(
                name=name,
                namespace=f"pipeline-{self.tag}-{name}",
                veth=f"pl{self.tag}{name}",
                peer=f"pl{self.tag}{name}n",
                address=f"{subnet}.{n + 2}",
            )
            ip("netns", "add", host.namespace)
            self._undo.append(("netns", "del", host.namespace))
            ip("link", "add", host.veth, "type", "veth", "peer", "name", host.peer)
            self._undo.append(("link", "del", host.veth))
            ip("link", "set", host.peer, "netns", host.namespace)
            ip("link", "set", host.veth, "master", self.bridge, "up")
            ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.peer)
            ip("-n", host.namespace, "link", "set", host.peer, "up")
            ip("-n", host.namespace, "link", "set", "lo", "up")
            self.hosts[name] = host
        return self

    def cut(self, name: str) -> None:
        """Cut `name`'s link: its veth goes down, and its packets go nowhere."""
        ip("link", "set", self.hosts[name].veth, "down")

    def restore(self, name: str) -> None:
        ip("link", "set", self.hosts[name].veth, "up")

    def pids(self, name: str) -> set[int]:
        """The processes running in `name`'s namespace now."""
        return {int(pid) for pid in ip("netns", "pids", self.hosts[name].namespace).split()}

    def remove(self) -> None:
        """Remove everything `create()` made, last first, each step bounded; raises, after
        trying them all, with what could not be removed."""
        left: list[str] = []
        while self._undo:
            step = self._undo.pop()
            try:
                ip(*step)
            except subprocess.CalledProcessError as exc:
                # A veth goes with its namespace's end: nothing is left to remove.
                if "Cannot find device" not in (exc.stderr or ""):
                    left.append(f"ip {' '.join(step)}: {(exc.stderr or '').strip()}")
            except subprocess.TimeoutExpired:
                left.append(f"ip {' '.join(step)}: timed out")
        if left:
            raise AssertionError("network namespaces left behind: " + "; ".join(left))


class NamespacedComponent(Component):
    """A `python -m app.cli ...` child process run in a host's network namespace."""

    def __init__(
        self, namespace: str, args: list[str], *, env: dict[str, str], log_path: Path
    ) -> None:
        super().__init__(args, env=env, log_path=log_path)
        self.namespace = namespace
        # `ip netns exec` execs the command: the PID stopped later is the command's own.
        self.argv = [_ip_binary(), "netns", "exec", namespace, *self.argv]


class Forwarder(Component):
    """A `tests.support.forward` process: each `(host, port)` of `mappings` forwarded to
    its target. `start()` returns once it listens."""

    def __init__(self, mappings: dict[tuple[str, int], tuple[str, int]], *, log_path: Path):
        arguments = [f"{lh}:{lp}={th}:{tp}" for (lh, lp), (th, tp) in mappings.items()]
        super().__init__(arguments, env=dict(os.environ), log_path=log_path)
        self.argv = [sys.executable, "-m", "tests.support.forward", *arguments]

    def start(self, env: dict[str, str] | None = None, **_: object) -> Component:
        super().start(env)
        self.wait_for_output("forwarding", timeout_s=15)
        return self
