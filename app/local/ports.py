"""The ports `pipeline up` listens on, checked before it starts anything.

A port another program holds would otherwise show up as one component dying half-way
through the start, with the others already running; checked first, it is one line that
names the port and what it is for."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from app.config.settings import Settings
from app.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class PortUse:
    """A port a component of `pipeline up` will listen on."""

    host: str
    port: int
    # What listens there, for a person: "the intake".
    purpose: str
    # The setting that moves it.
    setting: str

    def describe(self) -> str:
        return f"port {self.port} ({self.purpose}, {self.setting})"


def ports_of(settings: Settings, *, embedded_redis_port: int | None) -> list[PortUse]:
    """The ports `pipeline up` would listen on: the intake's, Flower's, and the embedded
    Redis's when it would start one (`embedded_redis_port`, None when a server answers)."""
    uses = [
        PortUse(
            host=settings.intake_host,
            port=settings.intake_port,
            purpose="the intake",
            setting="PIPELINE_INTAKE_PORT",
        ),
        PortUse(
            host=settings.flower_host,
            port=settings.flower_port,
            purpose="Flower",
            setting="PIPELINE_FLOWER_PORT",
        ),
    ]
    if embedded_redis_port is not None:
        uses.append(
            PortUse(
                host="127.0.0.1",
                port=embedded_redis_port,
                # Started because nothing answers PING at the URL (a Redis with another
                # password does not either).
                purpose="the embedded Redis; nothing answers PING at that URL",
                setting="PIPELINE_REDIS_URL",
            )
        )
    return uses


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on `host:port` now: a socket binds there (with
    SO_REUSEADDR, as uvicorn, Tornado and Valkey set it, so that connections of a
    stopped server waiting in TIME_WAIT do not count as taken)."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return True  # a host that does not resolve: the component says so itself
    for family, kind, proto, _name, address in addresses:
        with contextlib.closing(socket.socket(family, kind, proto)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError:
                return False
    return True


def first_conflict(
    uses: Iterable[PortUse], *, is_free: Callable[[str, int], bool] = port_is_free
) -> str | None:
    """Why `pipeline up` cannot listen where `uses` say, in one sentence; None when it can.
    Two components given one port conflict too. Port 0 (any free port) is never taken."""
    seen: dict[int, PortUse] = {}
    for use in uses:
        if use.port == 0:
            continue
        other = seen.get(use.port)
        if other is not None:
            return (
                f"port {use.port} is given to both {other.purpose} ({other.setting}) and "
                f"{use.purpose} ({use.setting}); set one of them to another port"
            )
        seen[use.port] = use
        if not is_free(use.host, use.port):
            return (
                f"{use.describe()} is taken: another program listens on "
                f"{use.host}:{use.port}; stop it or set {use.setting} to a free port"
            )
    return None


def check_ports(uses: Iterable[PortUse]) -> None:
    """Raises `ConfigError` naming the first port `pipeline up` cannot listen on."""
    conflict = first_conflict(uses)
    if conflict is not None:
        raise ConfigError(conflict)
