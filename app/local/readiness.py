"""Whether the components of `pipeline up` answer: the workers a ping, the intake and Flower
an HTTP request."""

from __future__ import annotations

from collections.abc import Iterable

import httpx
from celery import Celery
from celery.utils.nodenames import host_format

# Each probe waits this long at most: the supervisor asks again until its own deadline.
PROBE_TIMEOUT_S = 1.0


def worker_nodename(line: str) -> str:
    """The Celery node name `pipeline worker LINE` takes on this host (`--hostname LINE@%h`)."""
    return host_format(f"{line}@%h")


def workers_answering(celery: Celery, nodenames: Iterable[str]) -> set[str]:
    """Which of `nodenames` answer a ping over the broker now (an empty set when the broker
    does not answer either). A worker answers once its consumer listens for broadcasts,
    which is what Flower's inspect needs."""
    wanted = list(nodenames)
    try:
        with celery.connection_for_write() as conn:
            replies = celery.control.ping(
                destination=wanted, timeout=PROBE_TIMEOUT_S, connection=conn
            )
    except Exception:  # noqa: BLE001 - any broker failure means: not yet
        return set()
    answered = {name for reply in replies or [] for name in reply}
    return answered & set(wanted)


def http_answers(url: str) -> bool:
    """Whether an HTTP server answers at `url` with 2xx or 401 (Flower's basic auth)."""
    try:
        status = httpx.get(url, timeout=PROBE_TIMEOUT_S).status_code
    except httpx.HTTPError:
        return False
    return 200 <= status < 300 or status == 401
