"""The task every line's worker runs: one attempt of one journal record.

Its message comes from `app.admission` (or Celery's own publisher); the record id is the
task id. Retries are owned by the journal, not by countdown messages (DESIGN §6)."""

from __future__ import annotations

import os
import random
import time

from celery import Task, shared_task
from celery.exceptions import Reject

from app.admission import TASK_NAME
from app.clock import utcnow
from app.errors import JournalUnavailable
from app.logs import get_logger
from app.runner import run_record
from app.runtime import Runtime
from workers import (
    heartbeat,  # noqa: F401 - connects the heartbeat to the worker's signals
    kombu_patches,  # noqa: F401 - one client per channel; alive through a Redis loss
)

log = get_logger(__name__)
# How long a worker waits before handing back a message it could not journal.
JOURNAL_RETRY_PAUSE_S = 1.0

_runtime: tuple[int, Runtime] | None = None
_rng = random.Random()  # noqa: S311 - backoff jitter, not cryptography


def runtime_for(task: Task) -> Runtime:
    """This process's runtime, built on first use after any fork (engines and sockets must
    not cross a fork)."""
    global _runtime  # noqa: PLW0603 - one runtime per worker process
    if _runtime is None or _runtime[0] != os.getpid():
        # A pool process runs one task at a time: a small pool is enough.
        _runtime = (os.getpid(), Runtime.build(task.app.pipeline_settings, db_pool_size=2))
    return _runtime[1]


@shared_task(name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True)  # type: ignore[untyped-decorator]
def process(self: Task, record_id: str) -> str | None:
    """Run one attempt of `record_id`; returns the record's new status, or None.

    With the journal unreachable the message goes back on its queue after a pause, rather
    than being acked and left to the stuck threshold."""
    try:
        status = run_record(runtime_for(self), record_id, clock=utcnow, rng=_rng)
    except JournalUnavailable as exc:
        log.warning("journal_unavailable_requeued", record_id=record_id, error=str(exc))
        time.sleep(JOURNAL_RETRY_PAUSE_S)
        raise Reject(str(exc), requeue=True) from exc
    return status.value if status else None
