"""Records waiting in a long queue: the stuck threshold pushes again only what is not
there (each record stays on the queue once), and the lost-message check finds a lost
message wherever its record sits in the line, the newest included."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from app.admission.senders import low_queue
from app.clock import utcnow
from app.journal.models import RecordStatus
from app.wiring.runtime import Runtime
from tests.support.harness import Harness
from tests.support.journal import new_record
from tests.support.messages import message_args, queued_ids
from tests.support.processes import wait_for

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal

# Past the oldest 20,000 suspects the check read per line before this change
# (app/recovery/lost_messages.py), by 5,000: the newest records are out of that reach.
# Small enough to journal and push in seconds on SQLite.
LONG_QUEUE = 25_000
# Records accepted per group while building the long queue.
CHUNK = 2_500
REMOVED = 10
# How soon a record whose message is gone must be back on its queue.
RECOVERY_S = 30


def accept_orders(rt: Runtime, count: int, *, chunk: int) -> list[str]:
    """`count` records of `order`, journaled and pushed `chunk` at a time (a group each);
    their ids, oldest first."""
    ids: list[str] = []
    for start in range(0, count, chunk):
        news = [
            new_record("order", f"W-{n}", now=utcnow())
            for n in range(start, min(start + chunk, count))
        ]
        accepted = rt.acceptor.accept_many(news, clock=utcnow)
        assert {a.status for a in accepted} == {RecordStatus.ENQUEUED}
        ids.extend(new.id for new in news)
    return ids


def carried(raw: bytes) -> list[str]:
    """The record ids a queued message carries: one, or a batch."""
    args = message_args(raw)
    if isinstance(args, str):
        return [args]
    assert isinstance(args, list)
    return [str(arg) for arg in args]


def twice(queued: list[str]) -> dict[str, int]:
    """The record ids on the queue more than once, with how many times."""
    return {record_id: n for record_id, n in Counter(queued).items() if n > 1}


def test_records_waiting_past_every_threshold_stay_on_the_queue_once(
    harness: Harness,
) -> None:
    """A long wait is not a loss: records whose messages wait on their queue past the
    lost-message check's threshold are seen there, and neither the sweeper nor the check
    pushes them twice (before, a stuck threshold pushed every one of them again)."""
    harness.configure(lost_after_seconds="1", lines__order__batch_size="1")
    rt = harness.runtime()
    ids = accept_orders(rt, 30, chunk=30)
    assert Counter(queued_ids(rt.redis, "order")) == Counter(ids)

    # No worker: every record waits on the queue, past the threshold, twice over.
    for _ in range(2):
        time.sleep(2.5)  # past lost_after_seconds: a matter of the clock, nothing to poll
        for _ in range(3):
            rt.sweeper.sweep(now=utcnow())
            rt.lost.recover_lost(now=utcnow())
        queued = queued_ids(rt.redis, "order")
        doubled = twice(queued)
        assert not doubled, (
            f"{len(doubled)} of {len(ids)} waiting records are on the queue more than once "
            f"({len(queued)} ids in {rt.redis.llen('order')} messages)"
        )
        assert sorted(queued) == sorted(ids)
    assert {s for i, s in harness.statuses().items() if i in set(ids)} == {"enqueued"}


def test_the_newest_messages_of_a_long_queue_lost_are_back_within_30_s_and_once(
    harness: Harness,
) -> None:
    harness.configure(
        lines__order__max_queue_length=str(2 * LONG_QUEUE),
        lines__order__batch_size="1",
        lost_after_seconds="1",
        lost_check_interval_seconds="1",
    )
    rt = harness.runtime()
    ids = accept_orders(rt, LONG_QUEUE, chunk=CHUNK)
    # One sender's records: past its fair share they wait on the queue's low list.
    low = low_queue("order")
    assert rt.redis.llen("order") + rt.redis.llen(low) == LONG_QUEUE
    harness.start_beat()  # its lost-message check runs every second

    # LPUSH: the newest messages are at the head of the low list.
    removed: list[str] = []
    for _ in range(REMOVED):
        raw = rt.redis.lpop(low)
        assert isinstance(raw, bytes)
        removed.extend(carried(raw))
    removed_at = time.monotonic()
    assert set(removed) <= set(ids[-REMOVED:])  # the newest records' messages

    def all_back() -> bool:
        return set(removed) <= set(queued_ids(rt.redis, "order"))

    try:
        wait_for(all_back, timeout_s=RECOVERY_S, what="the removed messages' records")
    except AssertionError:
        back = set(removed) & set(queued_ids(rt.redis, "order"))
        raise AssertionError(
            f"{len(back)} of the {len(removed)} records whose message was removed are back on "
            f"the queue after {time.monotonic() - removed_at:.1f} s"
        ) from None

    # Two more checks: none pushes a record whose message is there.
    time.sleep(2.5)
    queued = queued_ids(rt.redis, "order")
    doubled = twice(queued)
    assert not doubled, f"{len(doubled)} records are on the queue more than once"
    assert len(queued) == LONG_QUEUE
    assert set(queued) == set(ids)
