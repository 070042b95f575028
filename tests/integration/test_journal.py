"""The journal's guarded transitions and the sweeper, on the real database and Redis."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import redis
from sqlalchemy import event

from app.admission.accept import Acceptance
from app.admission.push import TASK_NAME
from app.celery_app import create_celery
from app.clock import utcnow
from app.errors import UnboundedPublish
from app.ids import new_id
from app.journal import attempts, claims, expiry, store
from app.journal import engine as journal_engine
from app.journal.engine import make_engine
from app.journal.models import RecordStatus
from app.journal.schema import upgrade
from app.journal.transitions import Event as TransitionEvent
from tests.support.journal import backdate, force_status, new_record, run_record
from tests.support.messages import queued_ids

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal


def test_a_done_record_is_never_moved_by_a_late_or_duplicate_delivery(harness):
    rt = harness.runtime()
    now = utcnow()
    with rt.engine.begin() as conn:
        record, created = store.insert_record(conn, new_record("order", "A-1", now=now), now=now)
    assert created
    assert run_record(rt, record.id) is RecordStatus.DONE
    assert run_record(rt, record.id) is None  # a second message
    with rt.engine.begin() as conn:
        assert attempts.claim_attempt(conn, record.id, owner="late", lease_s=60, now=now) is None
        late = dataclasses.replace(record, attempts=1)
        assert not attempts.mark_failed(
            conn, late, owner="late", error="late", retry_at=now, now=now
        )
        assert store.move(conn, [record.id], TransitionEvent.SWEPT, now=now) == 0
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
    # One record to a message: the bound of 3 messages is then 3 records.
    harness.configure(
        lines__order__max_queue_length="3",
        lines__order__batch_size="1",
        lines__order__sender_queue_share="1",
    )
    rt = harness.runtime()
    old = datetime.now(UTC) - timedelta(minutes=5)
    ids = []
    with rt.engine.begin() as conn:
        for n in range(5):
            at = old + timedelta(seconds=n)
            record, _ = store.insert_record(conn, new_record("order", f"A-{n}", now=at), now=at)
            backdate(conn, [record.id], at)
            ids.append(record.id)
        fresh_at = utcnow()
        fresh, _ = store.insert_record(
            conn, new_record("order", "FRESH", now=fresh_at), now=fresh_at
        )
    result = rt.sweeper.sweep(now=utcnow())
    assert result.enqueued == {"order": 3}
    statuses = {r.id: r.status for r in harness.records()}
    # Only as many as there is room for are claimed; the rest wait, untouched, in order.
    assert [statuses[i] for i in ids] == [RecordStatus.ENQUEUED] * 3 + [RecordStatus.RECEIVED] * 2
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


def test_records_lost_with_redis_memory_are_enqueued_again_and_recovered_is_raised(harness):
    rt = harness.runtime()
    now = utcnow()
    ids = []
    with rt.engine.begin() as conn:
        for n in range(4):
            record, _ = store.insert_record(conn, new_record("refund", f"R-{n}", now=now), now=now)
            ids.append(record.id)
    epoch = rt.pusher.push("refund", ids, max_length=100).epoch
    with rt.engine.begin() as conn:
        store.mark_enqueued(conn, ids, epoch=epoch, now=now)
    assert rt.sweeper.sweep(now=utcnow()).enqueued == {}  # all on the queue: nothing to do

    rt.redis.flushall()  # the queue, and the epoch, are gone
    result = rt.sweeper.sweep(now=utcnow())
    assert result.recovered == {"refund": 4}
    assert sorted(queued_ids(rt.redis, "refund")) == sorted(ids)
    stored = {r.id: r for r in harness.records()}
    new_epoch = rt.pusher.epoch()
    assert new_epoch != epoch
    assert {stored[i].queue_epoch for i in ids} == {new_epoch}
    assert rt.sweeper.sweep(now=utcnow()).enqueued == {}


def test_the_sweeper_leaves_an_old_enqueued_record_of_this_epoch_to_the_lost_check(harness):
    """However long a record has been `enqueued` in this epoch, the sweeper does not push
    it again without looking: the lost-message check looks, and pushes it only if its
    message is gone (here it is: it was never pushed)."""
    harness.configure(lost_after_seconds="1")
    rt = harness.runtime()
    long_ago = utcnow() - timedelta(hours=1)
    with rt.engine.begin() as conn:
        record, _ = store.insert_record(
            conn, new_record("order", "S-1", now=long_ago), now=long_ago
        )
        store.mark_enqueued(conn, [record.id], epoch=rt.pusher.epoch(), now=long_ago)
        backdate(conn, [record.id], long_ago)
    result = rt.sweeper.sweep(now=utcnow())
    assert (result.enqueued, result.recovered) == ({}, {})
    assert rt.redis.llen("order") == 0
    assert rt.lost.recover_lost(now=utcnow()) == {"order": 1}
    assert queued_ids(rt.redis, "order") == [record.id]


def test_retention_deletes_old_done_records_only(harness):
    harness.configure(retention_days="1", retention_batch_size="2")
    rt = harness.runtime()
    old = utcnow() - timedelta(days=3)
    keep, gone = [], []
    with rt.engine.begin() as conn:
        for n in range(5):
            record, _ = store.insert_record(conn, new_record("order", f"D-{n}", now=old), now=old)
            store.mark_synced(conn, [record.id], now=old)
            gone.append(record.id)
        for status in (RecordStatus.FAILED, RecordStatus.DEAD, RecordStatus.RECEIVED):
            record, _ = store.insert_record(conn, new_record("order", status, now=old), now=old)
            force_status(conn, [record.id], status)
            keep.append(record.id)
        fresh, _ = store.insert_record(conn, new_record("order", "NEW", now=utcnow()), now=utcnow())
        store.mark_synced(conn, [fresh.id], now=utcnow())
        keep.append(fresh.id)
    assert rt.retention.purge(now=utcnow()) == 5
    assert sorted(r.id for r in harness.records()) == sorted(keep)


def test_two_sweepers_at_once_push_each_record_once(harness):
    rt = harness.runtime()
    other = harness.runtime()  # a second beat's pool of connections
    old = utcnow() - timedelta(minutes=5)
    ids = set()
    with rt.engine.begin() as conn:
        for n in range(300):
            record, _ = store.insert_record(conn, new_record("order", f"C-{n}", now=old), now=old)
            ids.add(record.id)
        backdate(conn, list(ids), old)
    barrier = threading.Barrier(2)

    def run(runtime) -> None:
        barrier.wait(timeout=10)
        runtime.sweeper.sweep(now=utcnow())

    threads = [threading.Thread(target=run, args=(r,)) for r in (rt, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(queued_ids(rt.redis, "order")) == sorted(ids)  # every record once, none twice
    assert {r.status for r in harness.records()} == {RecordStatus.ENQUEUED}


@pytest.mark.journal_independent
def test_statements_that_pick_records_by_id_go_through_the_primary_key_on_sqlite(tmp_path):
    """Without statistics SQLite would take `status = ?` through a status index rather
    than `id IN (…)` through the primary key, reading every record of that status once per
    batch (replay of a large journal slowed down with its size)."""
    engine = make_engine(f"sqlite:///{tmp_path / 'plans.db'}")
    upgrade(engine)
    statements: list[tuple[str, object]] = []

    def capture(_conn, _cursor, statement, parameters, _context, _executemany):
        if statement.startswith(("UPDATE", "DELETE")):
            statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    now = utcnow()
    news = [new_record("order", f"P-{n}", now=now) for n in range(3)]
    ids = [r.id for r in news]
    try:
        with engine.begin() as conn:
            store.insert_records(conn, news, now=now)
            store.move(conn, ids, TransitionEvent.DEFERRED, now=now)
            store.mark_enqueued(conn, ids, epoch="e", now=now)
            claims.set_epoch(conn, ids, epoch="e")
            expiry.delete_expired(conn, expiry.Cutoffs(done=now, undelivered=now), limit=10)
            claimed = attempts.claim_attempts(conn, ids, owner="o", lease_s=60, now=now)
            attempts.mark_done_all(conn, claimed, owner="o", now=now)
            attempts.claim_done_all(conn, ids[:1], line="order", max_attempts=8, now=now)
            attempts.claim_attempt(conn, ids[0], owner="o", lease_s=60, now=now)
        assert len(statements) >= 7
        with engine.connect() as conn:
            for statement, parameters in statements:
                plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
                assert "sqlite_autoindex_records_1 (id=?)" in str(plan), (statement, plan)
    finally:
        engine.dispose()


def test_an_id_picked_update_still_uses_the_primary_key_once_the_journal_has_grown(
    database_url, monkeypatch
):
    """On PostgreSQL a statement psycopg has prepared may get a generic plan, made for the
    table as it was: a sequential scan while the journal was nearly empty, kept while it
    grew (the intake's marking took 2-7 ms a group on a fresh journal). A connection
    checked out `REPLAN_AFTER_S` after it last did drops its cached plans."""
    if not database_url.startswith("postgresql"):
        pytest.skip(
            "PostgreSQL only: its plan cache; SQLite's plans are the previous test's subject"
        )
    monkeypatch.setattr(journal_engine, "REPLAN_AFTER_S", 0.5)
    engine = make_engine(database_url)  # the fixture's database is migrated already
    now = utcnow()
    few = [new_record("order", f"O-{n}", now=now) for n in range(16)]
    ids = [r.id for r in few]
    try:
        with engine.connect() as conn:
            store.insert_records(conn, few, now=now)
            conn.commit()
            # Run often enough for psycopg to prepare it and PostgreSQL to weigh a generic plan.
            for _ in range(15):
                store.move(conn, ids, TransitionEvent.DEFERRED, now=now)
                conn.commit()
            for start in range(0, 20_000, 2_000):
                more = [new_record("order", f"G-{start + n}", now=now) for n in range(2_000)]
                store.insert_records(conn, more, now=now)
            conn.commit()
        time.sleep(0.6)  # past REPLAN_AFTER_S: a matter of the clock, with nothing to poll
        with engine.connect() as conn:  # the same pooled connection, its plans dropped
            store.move(conn, ids, TransitionEvent.DEFERRED, now=now)
            seq_scans, index_scans = conn.exec_driver_sql(
                "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relname = 'records'"
            ).one()
            conn.rollback()
        assert (seq_scans, index_scans > 0) == (0, True)
    finally:
        engine.dispose()


def test_a_group_is_answered_once_committed_and_pushed_then_marked_enqueued(harness):
    """A group's push answers as soon as its rows are on the queue; marking them
    `enqueued` comes after, and a record still `received` then loses
    nothing (a worker claims it from either status)."""
    rt = harness.runtime()
    now = utcnow()
    news = [new_record("order", f"G-{n}", now=now) for n in range(3)]
    seen: dict[str, object] = {}

    def answered(outcomes: list[Acceptance]) -> None:
        seen["outcomes"] = [o.status for o in outcomes]
        seen["journal"] = {r.id: r.status for r in harness.records()}
        seen["queued"] = queued_ids(rt.redis, "order")

    stored = rt.acceptor.journal_many(news, clock=utcnow)
    rt.acceptor.admit_many(news, stored, clock=utcnow, on_admitted=answered)

    assert seen["outcomes"] == [RecordStatus.ENQUEUED] * 3
    assert seen["journal"] == {new.id: RecordStatus.RECEIVED for new in news}
    assert seen["queued"] == [new.id for new in news]
    assert {r.status for r in harness.records()} == {RecordStatus.ENQUEUED}
    assert run_record(rt, news[0].id) is RecordStatus.DONE


def test_a_group_pushes_the_line_with_fewest_records_first(harness):
    """A flood on one line fills most of a group: the other line's records, committed
    beside it, go onto their queue before the flood's push, not after."""
    rt = harness.runtime()
    now = utcnow()
    news = [new_record("status", f"F-{n}", now=now) for n in range(5)]
    news.insert(3, new_record("order", "O-1", now=now))
    news.append(new_record("refund", "R-1", now=now))
    news.append(new_record("refund", "R-2", now=now))
    watcher = redis.Redis.from_url(harness.env["PIPELINE_REDIS_URL"], socket_timeout=5)
    pushed: list[str] = []
    try:
        with watcher.monitor() as monitor:
            rt.acceptor.accept_many(news, clock=utcnow)
            while len(pushed) < 3:
                command = monitor.next_command()["command"].split()
                # EVALSHA sha numkeys queue epoch-key …; sent twice when the script is
                # not loaded yet (the first try answers NOSCRIPT).
                if command[0].upper() == "EVALSHA" and command[3] not in pushed:
                    pushed.append(command[3])
    finally:
        watcher.close()

    assert pushed == ["order", "refund", "status"]
    assert [len(queued_ids(rt.redis, q)) for q in ("order", "refund", "status")] == [1, 2, 5]


def test_statements_given_many_ids_change_exactly_those_records(harness):
    """`store.among` (an `= ANY(array)` on PostgreSQL, an `IN` list elsewhere) picks the
    records named, however many, and no other."""
    rt = harness.runtime()
    now = utcnow()
    news = [new_record("order", f"M-{n}", now=now) for n in range(2_500)]
    with rt.engine.begin() as conn:
        store.insert_records(conn, news, now=now)
    ids = [r.id for r in news]
    picked = ids[::2]
    with rt.engine.begin() as conn:
        assert store.move(conn, [], TransitionEvent.DEFERRED, now=now) == 0
        moved = store.move(conn, picked, TransitionEvent.DEFERRED, now=now)
        assert moved == len(picked)
        assert set(store.payloads(conn, ids[:3])) == set(ids[:3])
        assert store.payloads(conn, ["no-such-id", "'; DROP TABLE records; --"]) == {}
    statuses = {r.id: r.status for r in harness.records()}
    assert {i for i, s in statuses.items() if s is RecordStatus.DEFERRED} == set(picked)
    assert {i for i, s in statuses.items() if s is RecordStatus.RECEIVED} == set(ids[1::2])
