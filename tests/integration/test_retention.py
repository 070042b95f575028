"""Retention keeps up: one run deletes every expired final record (`done` after its days,
`dead`, `rejected` and `cancelled` after theirs), however many, oldest first, in short
batches that let the intake's writes through, and touches nothing else."""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import datetime, timedelta

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import event, func, insert, inspect, select

from app.clock import utcnow
from app.ids import new_id
from app.journal import attempt_log, attempts, audit, claims, operator_actions, store
from app.journal.attempt_log import Outcome, new_attempt
from app.journal.engine import make_engine
from app.journal.models import RecordStatus, Source, records
from app.journal.schema import SCRIPT_LOCATION, upgrade
from app.journal.store import NewRecord
from app.journal.transitions import Event
from tests.support.journal import backdate

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal

# Far above what one run deleted before (100 batches of 1,000), quick to write.
EXPIRED = 150_000
FILL_BATCH = 10_000


def _fill(conn, *, prefix: str, count: int, status: RecordStatus, finished_at, at) -> None:
    for start in range(0, count, FILL_BATCH):
        conn.execute(
            insert(records),
            [
                {
                    "id": f"{prefix}{n:020d}",
                    "line": "order",
                    "business_no": f"{prefix}-{n}",
                    "source": Source.INTAKE.value,
                    "dedup_key": f"{prefix}:{n}",
                    "body_sha256": "0" * 64,
                    "payload": {},
                    "status": status.value,
                    "attempts": 1,
                    "created_at": at,
                    "updated_at": at,
                    "finished_at": finished_at,
                    "task_id": None,
                }
                for n in range(start, min(count, start + FILL_BATCH))
            ],
        )


def _intake_record(now: datetime) -> NewRecord:
    record_id = new_id(now)
    return NewRecord(
        id=record_id,
        line="order",
        business_no=record_id,
        source=Source.INTAKE,
        dedup_key=f"test:{record_id}",
        body_sha256="0" * 64,
        payload={"business_no": record_id},
    )


def test_one_run_deletes_every_expired_record_in_short_batches_beside_the_intake(harness):
    harness.configure(retention_days="1", retention_batch_size="1000")
    rt = harness.runtime()
    now = utcnow()
    old, recent = now - timedelta(days=3), now - timedelta(hours=1)
    with rt.engine.begin() as conn:
        _fill(conn, prefix="X", count=EXPIRED, status=RecordStatus.DONE, finished_at=old, at=old)
        _fill(conn, prefix="N", count=50, status=RecordStatus.DONE, finished_at=recent, at=recent)
        for n, status in enumerate(s for s in RecordStatus if s is not RecordStatus.DONE):
            # Old and unfinished, or final and younger than the 30 days undelivered
            # records are kept.
            finished = old if status in (RecordStatus.DEAD, RecordStatus.REJECTED) else None
            _fill(conn, prefix=f"K{n}", count=20, status=status, finished_at=finished, at=old)
    with rt.engine.connect() as conn:
        kept_before = conn.execute(
            select(records.c.id, records.c.status, records.c.updated_at).where(
                records.c.id.notlike("X%")
            )
        ).all()
    assert len(kept_before) == 50 + 20 * (len(RecordStatus) - 1)

    batches: list[tuple[float, int]] = []

    def count_batches(_conn, cursor, statement, _params, _context, _many) -> None:
        if statement.startswith("DELETE FROM records"):
            batches.append((time.monotonic(), cursor.rowcount))

    inserted_at: list[float] = []
    stop = threading.Event()
    insert_errors: list[BaseException] = []

    def intake() -> None:
        try:
            while not stop.is_set():
                at = utcnow()
                with rt.journal.transaction() as conn:
                    store.insert_record(conn, _intake_record(at), now=at)
                inserted_at.append(time.monotonic())
                time.sleep(0.005)
        except BaseException as exc:  # noqa: BLE001 - reported below
            insert_errors.append(exc)

    event.listen(rt.engine, "after_cursor_execute", count_batches)
    inserter = threading.Thread(target=intake, daemon=True)
    try:
        inserter.start()
        deleted = rt.retention.purge(now=now)
    finally:
        stop.set()
        inserter.join(timeout=40)
        event.remove(rt.engine, "after_cursor_execute", count_batches)

    with rt.engine.connect() as conn:
        expired_left = conn.execute(
            select(func.count()).select_from(records).where(records.c.id.like("X%"))
        ).scalar_one()
        kept_after = conn.execute(
            select(records.c.id, records.c.status, records.c.updated_at).where(
                records.c.id.notlike("X%"), records.c.dedup_key.notlike("test:%")
            )
        ).all()
    assert expired_left == 0
    assert deleted == EXPIRED
    assert sorted(kept_after) == sorted(kept_before)  # untouched
    assert insert_errors == []
    assert harness.record_count() == len(kept_before) + len(inserted_at)
    # Each batch its own short statement of at most the batch size ...
    sizes = [n for _, n in batches if n]
    assert sum(sizes) == EXPIRED
    assert max(sizes) <= 1000
    # ... and the intake's writes got in between them, not only after the purge.
    first, last = batches[0][0], batches[-1][0]
    assert any(first < at < last for at in inserted_at), (first, last, inserted_at[:5])


def test_a_batch_finds_the_expired_records_through_their_indexes(harness):
    """Checked with each database's EXPLAIN: the expired records of each final status are
    found through the index on (status, the time it became final), in its order (a batch
    reads only what it may delete, where one used to read and sort every `done` record),
    then deleted by id."""
    harness.configure(
        retention_days="1", retention_undelivered_days="1", retention_batch_size="500"
    )
    rt = harness.runtime()
    now = utcnow()
    old, recent = now - timedelta(days=3), now - timedelta(hours=1)
    with rt.engine.begin() as conn:
        _fill(conn, prefix="X", count=5_000, status=RecordStatus.DONE, finished_at=old, at=old)
        _fill(conn, prefix="N", count=5_000, status=RecordStatus.DONE, finished_at=recent, at=old)
        _fill(conn, prefix="F", count=5_000, status=RecordStatus.FAILED, finished_at=None, at=old)
        # As the journal writes them: a dead record has a finished_at, a rejected one not.
        _fill(conn, prefix="D", count=2_000, status=RecordStatus.DEAD, finished_at=old, at=old)
        _fill(
            conn, prefix="E", count=2_000, status=RecordStatus.DEAD, finished_at=recent, at=recent
        )
        _fill(conn, prefix="R", count=2_000, status=RecordStatus.REJECTED, finished_at=None, at=old)
        _fill(
            conn, prefix="S", count=2_000, status=RecordStatus.REJECTED, finished_at=None, at=recent
        )
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("ANALYZE records")  # as autovacuum would, given the time
    statements: list[tuple[str, object]] = []

    def capture(_conn, _cursor, statement, parameters, _context, _many) -> None:
        if "FROM records" in statement:
            statements.append((statement, parameters))

    event.listen(rt.engine, "before_cursor_execute", capture)
    try:
        assert rt.retention.purge(now=now, max_batches=1) == 500
    finally:
        event.remove(rt.engine, "before_cursor_execute", capture)
    with rt.engine.connect() as conn:
        postgresql = conn.dialect.name == "postgresql"
        plans = [
            "\n".join(
                str(row[0] if postgresql else row[3])
                for row in conn.exec_driver_sql(
                    f"{'EXPLAIN' if postgresql else 'EXPLAIN QUERY PLAN'} {statement}",
                    parameters,
                )
            )
            for statement, parameters in statements
        ]
        conn.rollback()
    assert len(plans) == 2, plans  # a batch: a SELECT and a DELETE
    # The SELECT: a part for each final status, each through its index.
    found, undelivered = plans[0], 3  # dead, rejected, cancelled
    if postgresql:
        # The DELETE's plan depends on the table's size (a table this small is read whole
        # rather than looked up 500 times); its ids are looked up by primary key in a large
        # one, as every id-picked statement of the journal.
        assert found.count("Index Scan using ix_records_status_finished_at") == 1, plans
        assert found.count("Index Scan using ix_records_status_updated_at") == undelivered, plans
        assert "Sort" not in found, plans
    else:
        assert found.count("ix_records_status_finished_at (status=? AND finished_at<?)") == 1, plans
        assert found.count("ix_records_status_updated_at (status=? AND updated_at<?)") == (
            undelivered
        ), plans
        assert "TEMP B-TREE" not in "".join(plans), plans  # no sort of the expired
        assert "sqlite_autoindex_records_1 (id=?)" in plans[-1], plans


def _downgrade(engine, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, revision)


def test_the_migrations_index_the_records_as_the_models_say(database_url):
    engine = make_engine(database_url)  # the fixture's database is migrated already
    try:
        expected = {
            (index.name, tuple(column.name for column in index.columns))
            for index in records.indexes
        }
        with engine.connect() as conn:
            found = {
                (index["name"], tuple(index["column_names"]))
                for index in inspect(conn).get_indexes("records")
                if not index.get("duplicates_constraint")  # PostgreSQL's unique dedup_key
            }
        assert ("ix_records_status_finished_at", ("status", "finished_at")) in expected
        assert found == expected
        _downgrade(engine, "0005")  # down to the revision before, and back
        with engine.connect() as conn:
            names = {index["name"] for index in inspect(conn).get_indexes("records")}
        assert "ix_records_status_finished_at" not in names
        upgrade(engine)
        with engine.connect() as conn:
            names = {index["name"] for index in inspect(conn).get_indexes("records")}
        assert "ix_records_status_finished_at" in names
    finally:
        engine.dispose()


class SteppingClock:
    """A clock that moves `step_s` each time it is read."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 1000.0, step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def test_a_run_out_of_its_budget_stops_and_the_next_run_goes_on_from_there(harness):
    harness.configure(retention_days="1", retention_max_run_seconds="3.5")
    rt = harness.runtime()
    assert rt.retention.budget_s == 3.5
    now = utcnow()
    old = now - timedelta(days=3)
    with rt.engine.begin() as conn:
        _fill(conn, prefix="X", count=1_000, status=RecordStatus.DONE, finished_at=old, at=old)
    pauses: list[float] = []
    # Each batch reads the clock twice (its start, then the budget): 1 s a batch.
    retention = dataclasses.replace(
        rt.retention, batch_size=100, clock=SteppingClock(0.5), sleep=pauses.append
    )
    assert retention.purge(now=now) == 400  # 4 batches, out of time after the fourth
    assert pauses == [0.5] * 3  # as long as each batch took, by the clock
    assert retention.purge(now=now) == 400
    assert retention.purge(now=now) == 200  # the last, short batch: nothing left
    with rt.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(records)).scalar_one() == 0


def test_a_run_stops_between_batches_once_the_beat_may_not_go_on(harness):
    harness.configure(retention_days="1")
    rt = harness.runtime()
    now = utcnow()
    old = now - timedelta(days=3)
    with rt.engine.begin() as conn:
        _fill(conn, prefix="Y", count=1_000, status=RecordStatus.DONE, finished_at=old, at=old)
    asked: list[int] = []

    def go_on() -> bool:  # the lock is lost after the second batch
        asked.append(1)
        return len(asked) <= 2

    retention = dataclasses.replace(rt.retention, batch_size=100, sleep=lambda _s: None)
    assert retention.purge(now=now, go_on=go_on) == 200
    assert retention.purge(now=now) == 800


OWNER = "host:1:retention"


def _journaled(conn, status: RecordStatus, *, at: datetime, name: str) -> str:
    """A record brought to `status` at `at` by the journal's own writes, as the intake, an
    attempt or an operator leaves it. Returns its id."""
    record, _ = store.insert_record(conn, _intake_record(at), now=at)
    if status in (RecordStatus.DONE, RecordStatus.DEAD, RecordStatus.FAILED):
        claimed = attempts.claim_attempt(conn, record.id, owner=OWNER, lease_s=60, now=at)
        assert claimed is not None, name
        if status is RecordStatus.DONE:
            assert attempts.mark_done(conn, claimed, owner=OWNER, now=at), name
        else:
            retry_at = at + timedelta(minutes=1) if status is RecordStatus.FAILED else None
            assert attempts.mark_failed(
                conn, claimed, owner=OWNER, error="down", retry_at=retry_at, now=at
            ), name
        attempt_log.write(
            conn,
            [
                new_attempt(
                    record_id=record.id,
                    attempt=1,
                    started_at=at,
                    finished_at=at,
                    worker=("host", 1),
                    outcome=Outcome.DONE if status is RecordStatus.DONE else Outcome.FAILED,
                )
            ],
        )
    elif status is RecordStatus.REJECTED:
        assert store.move(conn, [record.id], Event.REJECTED, now=at) == 1, name
    elif status is RecordStatus.DEFERRED:
        assert store.move(conn, [record.id], Event.DEFERRED, now=at) == 1, name
    elif status is RecordStatus.ENQUEUED:
        assert store.mark_enqueued(conn, [record.id], epoch="e", now=at) == 1, name
    elif status is RecordStatus.CANCELLED:
        assert operator_actions.cancel(conn, [record.id], epoch=None, now=at), name
    else:
        assert status is RecordStatus.RECEIVED, name
    backdate(conn, [record.id], at)
    got = store.get_record(conn, record.id)
    assert got is not None
    assert got.status is status, name
    return record.id


def _ids(rt) -> set[str]:
    with rt.engine.connect() as conn:
        return set(conn.execute(select(records.c.id)).scalars())


def test_every_final_status_goes_after_its_own_days_and_nothing_unfinished_does(harness):
    harness.configure(retention_days="10", retention_undelivered_days="2")
    rt = harness.runtime()
    now = utcnow()

    def days_ago(days: float) -> datetime:
        return now - timedelta(days=days)

    with rt.journal.transaction() as conn:
        gone = {
            "done": _journaled(conn, RecordStatus.DONE, at=days_ago(11), name="done"),
            "dead": _journaled(conn, RecordStatus.DEAD, at=days_ago(3), name="dead"),
            "rejected": _journaled(conn, RecordStatus.REJECTED, at=days_ago(3), name="rejected"),
            "cancelled": _journaled(conn, RecordStatus.CANCELLED, at=days_ago(3), name="cancelled"),
            "put back": _journaled(conn, RecordStatus.DEAD, at=days_ago(5), name="put back"),
        }
        # A replay claimed this dead record and could not push it: it is dead again, with
        # its finished_at cleared by the claim.
        dead = store.get_record(conn, gone["put back"])
        assert dead is not None
        claimed = claims.claim_as_enqueued(
            conn, [dead], Event.REPLAYED, now=days_ago(3), fresh_attempts=True
        )
        assert claimed == [dead.id]
        claims.put_back(conn, [dead], now=days_ago(3))
        backdate(conn, [dead.id], days_ago(3))
        kept = {
            # Older than the undelivered records' days, younger than its own.
            "done": _journaled(conn, RecordStatus.DONE, at=days_ago(5), name="young done"),
            **{
                status.value: _journaled(conn, status, at=days_ago(1), name=status.value)
                for status in (RecordStatus.DEAD, RecordStatus.REJECTED, RecordStatus.CANCELLED)
            },
            # However old, an unfinished record stays.
            **{
                f"old {status.value}": _journaled(
                    conn, status, at=days_ago(30), name=f"old {status.value}"
                )
                for status in (
                    RecordStatus.RECEIVED,
                    RecordStatus.ENQUEUED,
                    RecordStatus.DEFERRED,
                    RecordStatus.FAILED,
                )
            },
        }
        audit.write(
            conn,
            actor="alice",
            action=audit.Action.CANCEL,
            target=f"record:{gone['cancelled']}",
            params={},
            result={"cancelled": 1},
            reason=None,
            now=days_ago(30),
        )
        # What the journal writes: no finished_at on a rejected record, nor on a dead one a
        # replay put back; updated_at on every one.
        for name in ("rejected", "put back"):
            record = store.get_record(conn, gone[name])
            assert record is not None
            assert record.finished_at is None, name

    assert rt.retention.purge(now=now) == len(gone)

    assert _ids(rt) == set(kept.values())
    with rt.journal.reading() as conn:
        assert [row.target for row in audit.newest(conn, limit=10)] == [
            f"record:{gone['cancelled']}"
        ]
        for name in ("dead", "put back"):  # their attempts went with them
            assert attempt_log.history(conn, gone[name]) == [], name
        assert len(attempt_log.history(conn, kept["dead"])) == 1


def test_a_run_takes_the_final_records_oldest_first_whatever_their_status(harness):
    harness.configure(retention_days="10", retention_undelivered_days="2", retention_batch_size="2")
    rt = harness.runtime()
    now = utcnow()
    retention = dataclasses.replace(rt.retention, sleep=lambda _s: None)
    with rt.journal.transaction() as conn:
        expired = [  # oldest first, by the time each became final
            _journaled(conn, status, at=now - timedelta(days=days), name=f"{status}-{days}")
            for status, days in (
                (RecordStatus.DONE, 20),
                (RecordStatus.DONE, 12),
                (RecordStatus.REJECTED, 5),
                (RecordStatus.DEAD, 4),
                (RecordStatus.CANCELLED, 3),
            )
        ]
        young_done = _journaled(conn, RecordStatus.DONE, at=now - timedelta(days=9), name="9")
    everything = {*expired, young_done}
    left = everything
    for batch in (expired[:2], expired[2:4], expired[4:]):
        assert retention.purge(now=now, max_batches=1) == len(batch)
        left = left - set(batch)
        assert _ids(rt) == left
    assert retention.purge(now=now) == 0
    assert _ids(rt) == {young_done}
