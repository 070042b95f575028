"""Whose keys a Redis database holds: `pipeline up` uses a server it did not start only
when the database holds nothing but the pipeline's own keys, unless told to share it.

The pipeline's keys, as a running stack leaves them: its own (`pipeline:`), kombu's
(`_kombu.binding…` and its bookkeeping, the `unacked` hash, its index and mutex), the
queues (each line's, and its priority queues `<queue>\\x06\\x16<n>`; Celery's default
`celery`), and the reply queues of Celery's remote control (`<id>.reply.celery.pidbox`).
No result backend is configured, so no `celery-task-meta-*` key is ours."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.admission.senders import PRIORITY_SEPARATOR
from app.config.redis import make_redis, masked_url

OUR_PREFIXES = ("pipeline:", "_kombu.")
KOMBU_KEYS = frozenset({"unacked", "unacked_index", "unacked_mutex", "celery"})
REPLY_SUFFIX = ".reply.celery.pidbox"
# Keys looked at, at most: a large database is judged by its first ones.
SCAN_LIMIT = 100_000
SAMPLES = 5


def is_ours(key: str, queues: Iterable[str]) -> bool:
    """Whether `key` is one the pipeline (its queues `queues`) or kombu makes."""
    if key.startswith(OUR_PREFIXES) or key in KOMBU_KEYS or key.endswith(REPLY_SUFFIX):
        return True
    return key.partition(PRIORITY_SEPARATOR)[0] in set(queues)


@dataclass(frozen=True, kw_only=True)
class ForeignKeys:
    """The keys of another application found in the database."""

    count: int
    # The first parts (up to the first `:`) of a few of them, never a whole key.
    samples: tuple[str, ...]
    # Whether the scan stopped at `SCAN_LIMIT` keys (`count` is then a lower bound).
    partial: bool


def foreign_keys(url: str, queues: Iterable[str], *, timeout_s: float = 5.0) -> ForeignKeys:
    """The keys of the database `url` names that are not the pipeline's. Raises
    `redis.RedisError` when it does not answer."""
    names = set(queues)
    client = make_redis(url, {"socket_connect_timeout": timeout_s, "socket_timeout": timeout_s})
    count, seen = 0, 0
    samples: list[str] = []
    try:
        for raw in client.scan_iter(count=1000):
            seen += 1
            key = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)
            if not is_ours(key, names):
                count += 1
                # A key's first part only: a whole key may be a secret (`sess:<token>`).
                prefix = key.split(":", 1)[0] + (":…" if ":" in key else "")
                if len(samples) < SAMPLES and prefix not in samples:
                    samples.append(prefix)
            if seen >= SCAN_LIMIT:
                return ForeignKeys(count=count, samples=tuple(sorted(samples)), partial=True)
    finally:
        client.close()
    return ForeignKeys(count=count, samples=tuple(sorted(samples)), partial=False)


def refusal(url: str, found: ForeignKeys) -> str:
    """Why `pipeline up` will not use the database, and the two ways out."""
    shown = ", ".join(repr(key) for key in found.samples)
    more = "at least " if found.partial else ""
    return (
        f"PIPELINE_REDIS_URL: the Redis at {masked_url(url)} is not one `pipeline up` "
        f"started, and its database holds {more}{found.count} key(s) of another application "
        f"(their names begin {shown}); the pipeline's queues would sit beside them. Use an empty "
        "database (another number at the end of PIPELINE_REDIS_URL, e.g. /1, or stop that "
        "server so `pipeline up` starts its own), or share it knowingly: "
        "`pipeline up --share-redis` (or PIPELINE_REDIS_SHARED=true)"
    )
