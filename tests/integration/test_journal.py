"""The journal's guarded transitions and the sweeper, on the real database and Redis."""

from __future__ import annotations

import dataclasses
import json
import random
from datetime import UTC, datetime, timedelta

import pytest

from app.admission import TASK_NAME
from app.celery_app import create_celery
from app.clock import utcnow
from app.errors import UnboundedPublish
from app.ids import new_id
from app.journal import store
from app.journal.models import RecordStatus, Source
from app.journal.store import NewRecord
from app.runner import run_record
from app.sweeper import sweep


def new_record(line: str, business_no: str, *, now: datetime) -> NewRecord:
    record_id = new_id(now)
    return NewRecord(
        id=record_id,
        line=line,
        business_no=business_no,
        source=Source.INTAKE,
        dedup_key=f"test:{record_id}",
        body_sha256="0" * 64,
        payload={"business_no": business_no},
    )


def test_a_done_record_is_never_moved_by_a_late_or_duplicate_delivery(harness):
    rt = harness.runtime()
    now = utcnow()
    with rt.engine.begin() as conn:
        record, created = store.insert_record(conn, new_record("order", "A-1", now=now), now=now)
    assert created
    rng = random.Random(1)
    assert run_record(rt, record.id, clock=utcnow, rng=rng) is RecordStatus.DONE
    assert run_record(rt, record.id, clock=utcnow, rng=rng) is None  # a second message
    with rt.engine.begin() as conn:
        assert store.claim_attempt(conn, record.id, now=now) is None
        assert not store.mark_failed(conn, record.id, error="late", retry_at=now, now=now)
        moved = store.set_status(
            conn,
            [record.id],
            RecordStatus.ENQUEUED,
            only_from=[RecordStatus.RECEIVED, RecordStatus.FAILED],
            now=now,
        )
        assert moved == 0
        final = store.get_record(conn, record.id)
    assert final is not None
    assert (final.status, final.attempts, final.last_error) == (RecordStatus.DONE, 1, None)
    assert [tuple(r) for r in harness.rows("SELECT business_no, record_id FROM orders")] == [
        ("A-1", record.id)
    ]


def test_the_same_dedup_key_is_stored_once(harness):
    rt = harness.runtime()
    now = utcnow()
    new = new_record("order", "A-1", now=now)
    with rt.engine.begin() as conn:
        first, created = store.insert_record(conn, new, now=now)
        retry = dataclasses.replace(new, id=new_id(now))  # same dedup key, another id
        again, created_again = store.insert_record(conn, retry, now=now)
    assert created
    assert not created_again
    assert again.id == first.id
    assert harness.record_count() == 1


def test_sweeper_pushes_old_received_records_oldest_first_within_the_bound(harness, redis_url):
    harness.configure(lines__order__max_queue_length="3")
    rt = harness.runtime()
    old = datetime.now(UTC) - timedelta(minutes=5)
    ids = []
    with rt.engine.begin() as conn:
        for n in range(5):
            at = old + timedelta(seconds=n)
            record, _ = store.insert_record(conn, new_record("order", f"A-{n}", now=at), now=at)
            ids.append(record.id)
        fresh_at = utcnow()
        fresh, _ = store.insert_record(
            conn, new_record("order", "FRESH", now=fresh_at), now=fresh_at
        )
    result = sweep(rt, now=utcnow())
    assert result.enqueued == {"order": 3}
    assert result.deferred == {"order": 2}
    statuses = {r.id: r.status for r in harness.records()}
    assert [statuses[i] for i in ids] == [RecordStatus.ENQUEUED] * 3 + [RecordStatus.DEFERRED] * 2
    assert statuses[fresh.id] is RecordStatus.RECEIVED  # inside its grace period: left alone
    assert rt.redis.llen("order") == 3
    # Oldest first: the worker pops from the tail, and the tail is the oldest record.
    assert json.loads(rt.redis.lindex("order", -1))["headers"]["id"] == ids[0]


def test_celerys_own_publish_path_cannot_bypass_the_bound(harness):
    rt = harness.runtime()
    celery = create_celery(harness.settings())
    try:
        with pytest.raises(UnboundedPublish):
            celery.send_task(TASK_NAME, args=["01X"], queue="order")
        celery.loader.import_default_modules()  # as a worker does: registers workers.tasks
        task = celery.tasks[TASK_NAME]  # the registered task: apply_async goes the same way
        with pytest.raises(UnboundedPublish):
            task.apply_async(args=["01X"], queue="order")
    finally:
        celery.close()
    assert rt.redis.llen("order") == 0
