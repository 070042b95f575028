"""Which Redis URLs the pipeline takes: one server (`redis://`, `rediss://`), or a primary
found through Redis Sentinel:

    sentinel://[:password@]host:port[,host:port…]/db?master=NAME[&sentinel_password=…]

The password is the primary's (and its replicas'); `sentinel_password` is the sentinels'
own, when they require one. A port left out is Sentinel's, 26379. Checked when the settings
are read, so a malformed URL stops every command at its start with one line naming
`PIPELINE_REDIS_URL`, never repeating the URL (it may hold a password)."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

SENTINEL_SCHEME = "sentinel"
# Redis Sentinel's own port, as its documentation and sentinel.conf give it.
SENTINEL_PORT = 26379
EXAMPLES = (
    "redis://host:6379/0, rediss://host:6380/0 or sentinel://host1:26379,host2:26379/0?master=NAME"
)
_QUERY_KEYS = {"master", "sentinel_password"}


@dataclass(frozen=True, kw_only=True)
class SentinelUrl:
    """A `sentinel://` URL, read."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


def is_sentinel(url: str) -> bool:
    return url.startswith(f"{SENTINEL_SCHEME}://")


def redis_url_problem(url: str) -> str | None:
    """Why `url` cannot be the pipeline's Redis, as a sentence that never repeats the URL;
    None when it can."""
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme in ("redis", "rediss"):
        return None
    if scheme != SENTINEL_SCHEME:
        return f"must start with redis://, rediss:// or sentinel://; e.g. {EXAMPLES}"
    try:
        parse_sentinel_url(url)
    except ValueError as exc:
        return str(exc)
    return None


def check_redis_url(url: str) -> str:
    """A pydantic validator: `url`, or `ValueError` saying what is wrong with it."""
    problem = redis_url_problem(url)
    if problem is not None:
        raise ValueError(problem)
    return url


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Read a `sentinel://` URL. Raises `ValueError` naming what is wrong (never the URL)."""
    example = "e.g. sentinel://host1:26379,host2:26379/0?master=NAME"
    rest = url.removeprefix(f"{SENTINEL_SCHEME}://")
    rest, _, fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        hosts, userinfo = netloc, ""
    sentinels = tuple(_host_port(part, example) for part in hosts.split(","))
    db_text = path.strip("/") or "0"
    if not db_text.isdigit():
        raise ValueError(f"the database after the sentinels must be a number; {example}")
    params = urllib.parse.parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(params) - _QUERY_KEYS)
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r}; only master and sentinel_password")
    masters = params.get("master", [])
    if len(masters) != 1 or not masters[0].strip():
        raise ValueError(f"names no primary: add ?master=NAME (Sentinel's name for it); {example}")
    username, _, password = userinfo.partition(":")
    sentinel_passwords = params.get("sentinel_password", [])
    if fragment:
        raise ValueError(f"has a '#' part, which a sentinel URL cannot have; {example}")
    return SentinelUrl(
        sentinels=sentinels,
        master=masters[0],
        db=int(db_text),
        username=urllib.parse.unquote(username) or None,
        password=urllib.parse.unquote(password) or None,
        sentinel_password=sentinel_passwords[-1] if sentinel_passwords else None,
    )


def _host_port(text: str, example: str) -> tuple[str, int]:
    if text.startswith("["):  # an IPv6 address, [::1]:26379
        host, _, port_text = text[1:].partition("]")
        port_text = port_text.removeprefix(":")
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise ValueError(f"lists a sentinel with no host; {example}")
    if not port_text:
        return host, SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"lists a sentinel whose port is not a number from 1 to 65535; {example}")
    return host, int(port_text)


def kombu_broker(url: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The broker URL and the extra transport options of kombu's Redis transport for `url`.
    kombu's Sentinel transport takes one `sentinel://` URL per sentinel, `;`-separated, the
    primary's name and the sentinels' own client options as transport options."""
    if not is_sentinel(url):
        return url, {}
    parsed = parse_sentinel_url(url)
    auth = ""
    if parsed.password is not None or parsed.username is not None:
        user = urllib.parse.quote(parsed.username or "", safe="")
        auth = f"{user}:{urllib.parse.quote(parsed.password or '', safe='')}@"
    hosts = [f"[{h}]" if ":" in h else h for h, _ in parsed.sentinels]
    broker = ";".join(
        f"{SENTINEL_SCHEME}://{auth}{host}:{port}/{parsed.db}"
        for host, (_, port) in zip(hosts, parsed.sentinels, strict=True)
    )
    return broker, {
        "master_name": parsed.master,
        "sentinel_kwargs": sentinel_client_options(parsed, options),
    }


def sentinel_client_options(parsed: SentinelUrl, options: dict[str, Any]) -> dict[str, Any]:
    """The options of a client of the sentinels themselves: the same timeouts as the
    primary's, and the sentinels' password if they have one."""
    found = {k: v for k, v in options.items() if k.startswith("socket_")}
    if parsed.sentinel_password is not None:
        found["password"] = parsed.sentinel_password
    return found
