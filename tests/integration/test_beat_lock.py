"""The beat's lock on a real Redis: who holds it, since when, and for how long this beat
may count on it without a renewal."""

from __future__ import annotations

from datetime import UTC, datetime

import redis

from beat.lock import LOCK_KEY, BeatLock

TAKEN_AT = datetime(2026, 5, 1, 10, 0, 1, 200_000, tzinfo=UTC)


def test_a_holder_counts_on_the_lock_for_one_ttl_after_its_last_renewal_was_sent(redis_url):
    client = redis.Redis.from_url(redis_url)
    clock_s = [100.0]
    try:
        first = BeatLock(client, ttl_s=3, clock=lambda: clock_s[0], wall_clock=lambda: TAKEN_AT)
        other = BeatLock(client, ttl_s=3)
        assert first.active_since() is None
        assert first.hold() == (True, None)
        assert other.hold() == (False, None)
        assert other.active_since() is None
        assert client.get(LOCK_KEY).decode() == first.identity

        clock_s[0] = 102.9  # renewed at 100.0: still ours until 103.0
        assert first.active_since() == TAKEN_AT
        clock_s[0] = 103.0  # no renewal sent for a TTL: the key may be gone by now
        assert first.active_since() is None
        assert first.hold() == (True, None)  # renewed: held since the same time
        assert first.active_since() == TAKEN_AT

        client.delete(LOCK_KEY)  # lost, then taken by the other beat
        assert other.hold() == (True, first.identity)  # a takeover
        assert first.hold() == (False, None)
        assert first.active_since() is None
        first.release()  # not the holder: gives nothing up
        assert client.get(LOCK_KEY).decode() == other.identity
    finally:
        client.close()
