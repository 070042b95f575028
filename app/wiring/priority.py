"""A process's CPU priority: `PIPELINE_NICE` lowers it at start (as `nice` does), so that
a bulk line's intake and workers give way to the others' when the CPUs are busy."""

from __future__ import annotations

import os

from app.telemetry.logs import get_logger

log = get_logger(__name__)


def lower_priority(nice: int, *, component: str) -> None:
    """Lower this process's CPU priority to `nice` (0-19) unless it already is that low.
    A priority is never raised: that takes privileges, and no setting here asks for it."""
    if nice <= 0:
        return
    current = os.nice(0)
    if current < nice:
        os.nice(nice - current)
        log.info("cpu_priority_lowered", component=component, nice=nice)
