"""Who the intake may answer: signed requests from anywhere when it has keys; in dev mode
(no keys, `PIPELINE_DEV_MODE=true`), unsigned requests from this machine only.

Dev mode holds however the intake is started. `pipeline intake` refuses a host that is not
loopback; the factory (`app.intake.asgi`) refuses one in `PIPELINE_INTAKE_HOST`, but uvicorn
may still have been told to bind elsewhere, so the app itself answers only clients whose
address is loopback, and only requests whose `Host` is a loopback name: a page elsewhere
that rebinds its own name to 127.0.0.1 (DNS rebinding) is refused too.

In every mode, a browser page of another site may not act on the intake: a state-changing
request whose `Origin` (or `Sec-Fetch-Site`) says so is refused (`cross_site`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from app.config.settings import Settings
from app.errors import ConfigError, HostNotAllowed, NotLoopback
from app.intake.errors import response_for
from app.telemetry.logs import get_logger

log = get_logger(__name__)

LOOPBACK_NAMES = frozenset({"localhost"})


def is_loopback_address(host: str) -> bool:
    """Whether `host` is an IP address of this machine's loopback (127.0.0.0/8, ::1, and
    127.0.0.0/8 mapped into IPv6)."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    # A dual-stack socket shows an IPv4 client as ::ffff:127.0.0.1.
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a Host header: a name or address, with an optional port) names
    this machine's loopback: localhost, 127.0.0.1 (or 127.x.y.z), [::1]."""
    host = host.strip().lower()
    if host.startswith("["):  # [::1] or [::1]:8000
        address, sep, rest = host[1:].partition("]")
        return bool(sep) and (not rest or _is_port(rest)) and is_loopback_address(address)
    name, sep, port = host.partition(":")
    if sep and not _is_port(":" + port):
        return False
    return name in LOOPBACK_NAMES or is_loopback_address(name)


def _is_port(text: str) -> bool:
    return text.startswith(":") and text[1:].isascii() and text[1:].isdigit()


def check_keys_or_dev_mode(settings: Settings) -> None:
    """Raises `ConfigError` when the intake has no keys and dev mode was not asked for;
    logs a warning line when it starts in dev mode."""
    if settings.intake_keys:
        return
    if not settings.dev_mode:
        raise ConfigError(
            "PIPELINE_INTAKE_KEYS: not set, so every request would be unsigned; set it, or "
            "set PIPELINE_DEV_MODE=true for an unsigned intake on 127.0.0.1 only"
        )
    log.warning(
        "intake_dev_mode",
        message="dev mode (PIPELINE_DEV_MODE, no PIPELINE_INTAKE_KEYS): unsigned requests "
        "accepted, from this machine only, Host localhost, 127.0.0.1 or [::1]; admin "
        "endpoints open unless PIPELINE_ADMIN_TOKEN or PIPELINE_ADMIN_TOKENS is set",
    )


def check_bind_host(settings: Settings, host: str) -> None:
    """Raises `ConfigError` when the intake is in dev mode and `host` is not loopback."""
    if settings.in_dev_mode and not is_loopback_address(host):
        raise ConfigError(
            f"PIPELINE_INTAKE_HOST (or --host): dev mode (no PIPELINE_INTAKE_KEYS) listens "
            f"on 127.0.0.1 only, not {host!r}; set PIPELINE_INTAKE_KEYS to listen there"
        )


class LoopbackOnly:
    """ASGI middleware of dev mode: a client whose address is not loopback gets 403, a
    request whose Host is not a loopback name gets 421, both the usual JSON error."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        # No client address: a Unix socket, which is this machine by construction.
        if client is not None and not is_loopback_address(str(client[0])):
            await response_for(NotLoopback())(scope, receive, send)
            return
        hosts = [value for name, value in scope["headers"] if name == b"host"]
        if len(hosts) != 1 or not is_loopback_host(hosts[0].decode("latin-1")):
            await response_for(HostNotAllowed())(scope, receive, send)
            return
        await self.app(scope, receive, send)


# Methods a page elsewhere could use to act: every one but the reads.
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# What a browser says of where a request comes from (Fetch Metadata): only these are this
# intake's own page or the user's own typing. `same-site` is another port of this host.
OWN_FETCH_SITES = frozenset({"same-origin", "none"})
DEFAULT_PORTS = {"http": "80", "https": "443"}


def cross_site(method: str, headers: Mapping[str, str]) -> str | None:
    """Why a state-changing request comes from another site's page (None: it does not).

    A browser names the page's origin in `Origin` (and where it stands in `Sec-Fetch-Site`)
    on every POST; curl and server-to-server clients send neither, and go on. An `Origin`
    whose host and port are not the request's `Host` (nor, behind a proxy that rewrites
    `Host`, its `X-Forwarded-Host`) is another site's, and so is `Origin: null` (a sandboxed
    frame, a file). A page elsewhere cannot send `X-Forwarded-Host` itself: a header of its
    own makes the browser ask the intake first (CORS), and the intake allows none."""
    if method in READ_METHODS:
        return None
    site = headers.get("sec-fetch-site")
    if site is not None and site.lower() not in OWN_FETCH_SITES:
        return f"Sec-Fetch-Site is {site!r}"
    origin = headers.get("origin")
    if origin is None:
        return None
    own = [headers.get("host", ""), *headers.get("x-forwarded-host", "").split(",")[:1]]
    if _authority(origin) not in {_with_port(host, origin) for host in own if host.strip()}:
        return f"Origin {origin[:200]!r} is not this intake's"
    return None


def _authority(origin: str) -> str | None:
    """`host:port` of an origin (`scheme://host[:port]`), the port made explicit."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    if not sep or not rest or "/" in rest:
        return None  # "null", or not an origin
    return rest if _has_port(rest) else f"{rest}:{DEFAULT_PORTS.get(scheme, '')}"


def _with_port(host: str, origin: str) -> str:
    """A `Host` header's `host:port`, with the origin's scheme's port when it has none."""
    host = host.strip().lower()
    scheme = origin.strip().lower().partition("://")[0]
    return host if _has_port(host) else f"{host}:{DEFAULT_PORTS.get(scheme, '')}"


def _has_port(authority: str) -> bool:
    _, sep, port = authority.rpartition(":")
    return bool(sep) and port.isdigit() and not authority.endswith("]")
