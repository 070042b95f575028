"""The retry policy: pure, no I/O."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.line_settings import LineSettings


@dataclass(frozen=True, kw_only=True)
class Decision:
    """After a failed attempt: retry at `retry_at`, or give up (`retry_at` is None)."""

    retry_at: datetime | None

    @property
    def dead(self) -> bool:
        return self.retry_at is None


def backoff_s(attempts: int, *, initial_s: float, max_s: float, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(max_s, initial_s * 2^(attempts-1))]."""
    ceiling = min(max_s, initial_s * 2 ** max(attempts - 1, 0))
    return rng.uniform(0, ceiling)


def decide(attempts: int, *, policy: LineSettings, now: datetime, rng: random.Random) -> Decision:
    """What to do after attempt number `attempts` (the first is 1) failed."""
    if attempts >= policy.max_attempts:
        return Decision(retry_at=None)
    delay_s = backoff_s(
        attempts, initial_s=policy.backoff_initial_s, max_s=policy.backoff_max_s, rng=rng
    )
    return Decision(retry_at=now + timedelta(seconds=delay_s))
