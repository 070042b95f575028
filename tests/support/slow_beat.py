"""A beat whose retention runs last `SLOW_RETENTION_S` longer each, as big ones would:
`harness.start_beat(scheduler=SLOW_RETENTION_SCHEDULER)` starts one."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from app.telemetry.logs import get_logger
from beat.maintenance import Job
from beat.scheduler import PipelineScheduler

log = get_logger(__name__)

SLOW_RETENTION_SCHEDULER = "tests.support.slow_beat:SlowRetentionScheduler"
# Each retention run lasts this long: longer than the lock's TTL of the beat tests (3 s), and
# than the 3 s after which a fire counts as missed.
SLOW_RETENTION_S = 5
# Logged by each slowed run.
SLOW_RUN = "retention_slowed_for_test"


class SlowRetentionScheduler(PipelineScheduler):
    """The pipeline's scheduler, with each retention run followed by a wait of
    `SLOW_RETENTION_S` (cut short when the beat stops)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._closing = threading.Event()
        super().__init__(*args, **kwargs)

    def maintenance_jobs(self) -> list[Job]:
        return [
            self._slowed(job) if job.name == "retention" else job
            for job in super().maintenance_jobs()
        ]

    def _slowed(self, job: Job) -> Job:
        def run() -> None:
            job.run()
            log.info(SLOW_RUN, seconds=SLOW_RETENTION_S)
            self._closing.wait(SLOW_RETENTION_S)

        return dataclasses.replace(job, run=run)

    def close(self) -> None:
        self._closing.set()
        super().close()
