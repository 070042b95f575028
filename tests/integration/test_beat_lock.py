"""The beat's lock on a real Redis: who holds it, since when, and for how long this beat
may count on it without a renewal."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from beat.lock import LOCK_KEY, BeatLock, Renewer
from tests.support.processes import wait_for

TAKEN_AT = datetime(2026, 5, 1, 10, 0, 1, 200_000, tzinfo=UTC)
# Longer than the lock's client waits for an answer; the pause is lifted sooner.
PAUSE_MS = 5000


@contextlib.contextmanager
def paused(admin: redis.Redis) -> Iterator[None]:
    """Redis holds every write (scripts too) until the block ends."""
    admin.execute_command("CLIENT", "PAUSE", str(PAUSE_MS), "WRITE")
    try:
        yield
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")


def test_a_holder_counts_on_the_lock_for_one_ttl_after_its_last_renewal_was_sent(redis_url):
    client = redis.Redis.from_url(redis_url)
    clock_s = [100.0]
    wall = [TAKEN_AT]
    try:
        first = BeatLock(client, ttl_s=3, clock=lambda: clock_s[0], wall_clock=lambda: wall[0])
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
        wall[0] = TAKEN_AT + timedelta(seconds=3)
        assert first.hold() == (True, None)  # still ours, but not counted on meanwhile
        assert first.active_since() == wall[0]

        client.delete(LOCK_KEY)  # lost, then taken by the other beat
        assert other.hold() == (True, first.identity)  # a takeover
        assert first.hold() == (False, None)
        assert first.active_since() is None
        first.release()  # not the holder: gives nothing up
        assert client.get(LOCK_KEY).decode() == other.identity
    finally:
        client.close()


def test_a_renewal_that_fails_keeps_the_lock_and_the_time_it_was_taken_until_it_lapses(
    redis_url,
):
    # The lock's client gives up on a command after 0.2 s, at once: a Redis that pauses
    # longer (CLIENT PAUSE, as on a blip) fails that renewal and no other.
    client = redis.Redis.from_url(redis_url, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
    admin = redis.Redis.from_url(redis_url)
    clock_s = [100.0]
    wall = [TAKEN_AT]
    try:
        lock = BeatLock(client, ttl_s=3, clock=lambda: clock_s[0], wall_clock=lambda: wall[0])
        assert lock.hold() == (True, None)
        wall[0] = TAKEN_AT + timedelta(seconds=5)  # what a fresh start would count from

        clock_s[0] = 101.0
        with paused(admin):
            assert lock.hold() == (True, None)  # no answer: ours until 103.0 all the same
        assert lock.last_error is not None
        assert lock.active_since() == TAKEN_AT
        assert client.get(LOCK_KEY).decode() == lock.identity
        clock_s[0] = 102.0
        assert lock.hold() == (True, None)  # still ours, and never doubted since 100.0
        assert lock.last_error is None
        assert lock.active_since() == TAKEN_AT

        clock_s[0] = 105.0  # renewed at 102.0: ours until 105.0, no longer
        with paused(admin):
            assert lock.hold() == (False, None)
        assert lock.active_since() is None
        clock_s[0] = 105.5
        assert lock.hold() == (True, None)  # still ours in Redis, after a lapse
        assert lock.active_since() == wall[0]
    finally:
        client.close()
        admin.close()


def test_the_renewer_goes_on_after_a_result_it_could_not_handle(redis_url):
    client = redis.Redis.from_url(redis_url)
    results: list[bool] = []

    def on_result(held: bool, _took_over_from: str | None) -> None:
        results.append(held)
        if len(results) == 1:
            raise RuntimeError("the first result fails to be handled")

    renewer = Renewer(BeatLock(client, ttl_s=3), every_s=0.05, on_result=on_result)
    renewer.start()
    try:
        wait_for(lambda: len(results) >= 2, timeout_s=5, what="a renewal after the failed one")
    finally:
        assert renewer.stop(timeout_s=5)
        client.close()
    assert results[:2] == [True, True]
