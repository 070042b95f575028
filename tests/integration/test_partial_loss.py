"""A partial loss of Redis: single messages gone while the epoch stays (a failover to a
lagging replica, the last second of an append-only file, a hand-removed message). The
records whose message is gone are pushed again within 30 s; those merely waiting in a
long queue are not pushed twice."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from app.clock import utcnow
from app.journal.models import RecordStatus
from tests.support.journal import journal_records
from tests.support.messages import message_args, queued_ids
from tests.support.processes import wait_for
from tests.support.runs import overlapping, runs_by_record, use_runs_log

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal


def remove_messages(client, queue: str, count: int) -> list[str]:
    """LREM `count` single-record messages from `queue`, oldest first; their record ids."""
    removed = []
    for raw in reversed(client.lrange(queue, 0, -1)):
        if len(removed) == count:
            break
        args = message_args(raw)
        ids = [args] if isinstance(args, str) else args
        if isinstance(ids, list) and len(ids) == 1 and client.lrem(queue, 1, raw) == 1:
            removed.append(ids[0])
    assert len(removed) == count
    return removed


def test_records_whose_message_was_removed_are_pushed_again_once(harness):
    harness.configure(lost_after_seconds="0.5")
    client = harness.start_intake()
    ids = [
        client.post("/v1/refund", json={"business_no": f"L-{n}"}).json()["id"] for n in range(40)
    ]
    rt = harness.runtime()
    assert sorted(queued_ids(rt.redis, "refund")) == sorted(ids)
    assert rt.lost.recover_lost(now=utcnow()) == {}  # all waiting: nothing is pushed

    removed = remove_messages(rt.redis, "refund", 5)
    # Past lost_after_seconds: a matter of the clock, with nothing to poll (polling
    # recover_lost would push the five one by one as each came of age).
    time.sleep(0.6)
    assert rt.lost.recover_lost(now=utcnow()) == {"refund": 5}
    assert Counter(queued_ids(rt.redis, "refund")) == Counter(ids)  # each once, again
    assert rt.lost.recover_lost(now=utcnow()) == {}
    stored = {r.id: r for r in harness.records()}
    assert {stored[i].status.value for i in removed} == {"enqueued"}
    assert {stored[i].queue_epoch for i in ids} == {rt.pusher.epoch()}


def test_a_record_claimed_for_a_push_that_never_happened_is_pushed_again(harness):
    """A sweeper killed between its claim (`enqueued`, no epoch yet) and its push."""
    harness.configure(lost_after_seconds="0.5")
    rt = harness.runtime()
    (record_id,) = journal_records(
        rt, [{"business_no": "K-1"}], line="order", status=RecordStatus.ENQUEUED
    )
    assert rt.lost.recover_lost(now=utcnow()) == {}  # too recent: its pusher may be at work
    time.sleep(0.6)  # past lost_after_seconds: a matter of the clock, with nothing to poll
    assert rt.lost.recover_lost(now=utcnow()) == {"order": 1}
    assert queued_ids(rt.redis, "order") == [record_id]
    (stored,) = harness.records()
    assert stored.queue_epoch == rt.pusher.epoch()


def test_messages_removed_under_load_come_back_within_30_s_and_run_once(harness, tmp_path):
    log = use_runs_log(harness, tmp_path)
    harness.configure(lost_after_seconds="2", lost_check_interval_seconds="2")
    client = harness.start_intake()
    harness.start_beat()
    rt = harness.runtime()
    ids: list[str] = []

    def load() -> None:
        for n in range(150):
            body = {"business_no": f"U-{n}", "sleep_s": 0.02}
            ids.append(client.post("/v1/order", json=body).json()["id"])
            time.sleep(0.01)  # paces the load, so the removal below happens under it

    producer = threading.Thread(target=load, daemon=True)
    producer.start()
    wait_for(lambda: rt.redis.llen("order") >= 40, timeout_s=30, what="a queue of 40")
    removed = remove_messages(rt.redis, "order", 6)
    removed_at = time.monotonic()
    harness.start_worker("order", pool="prefork", concurrency=2)
    producer.join(timeout=60)
    assert not producer.is_alive()

    harness.wait_until_final(set(removed), timeout_s=30 - (time.monotonic() - removed_at))
    final = harness.wait_until_final(set(ids), timeout_s=60)
    assert {r.status.value for r in final.values()} == {"done"}
    runs = runs_by_record(log)
    assert overlapping(runs) == {}
    assert {record_id: len(spans) for record_id, spans in runs.items()} == dict.fromkeys(ids, 1)
