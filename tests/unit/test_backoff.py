from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from app.config.line_settings import LineSettings
from app.delivery.outcomes import backoff_s, decide

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_backoff_is_full_jitter_under_a_doubling_ceiling_with_a_cap():
    rng = random.Random(1)
    for attempts, ceiling in [(1, 2.0), (2, 4.0), (3, 8.0), (10, 600.0), (40, 600.0)]:
        delays = [backoff_s(attempts, initial_s=2.0, max_s=600.0, rng=rng) for _ in range(500)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8  # jitter spreads over the whole range
        assert min(delays) < ceiling * 0.2


def test_decide_retries_until_max_attempts_then_gives_up():
    policy = LineSettings(max_attempts=3)
    rng = random.Random(2)
    first = decide(1, policy=policy, now=NOW, rng=rng)
    assert first.retry_at is not None
    assert NOW <= first.retry_at <= NOW + timedelta(seconds=2)
    assert not decide(2, policy=policy, now=NOW, rng=rng).dead
    assert decide(3, policy=policy, now=NOW, rng=rng).dead
    assert decide(3, policy=policy, now=NOW, rng=rng).retry_at is None


def test_a_single_attempt_policy_is_dead_at_once():
    assert decide(1, policy=LineSettings(max_attempts=1), now=NOW, rng=random.Random(3)).dead
