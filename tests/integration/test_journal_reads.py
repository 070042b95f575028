"""Reads of the journal (the line view behind `/v1/lines` and `/metrics`, `/readyz`) run in
read-only transactions: they never hold up a write, and the line view's whole-journal
GROUP BY runs at most once a second however many poll it."""

from __future__ import annotations

import threading
import time
from datetime import datetime

import pytest
from sqlalchemy import event, text

from app.clock import utcnow
from app.errors import JournalUnavailable
from app.ids import new_id
from app.journal import store
from app.journal.models import Source
from app.journal.store import NewRecord
from app.observe.metrics import render

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal

# How long a write may take beside an open read before it counts as held up by it: far
# above a commit's milliseconds, far below the 30 s a writer waits for SQLite's lock.
WRITE_WAIT_S = 5.0


def new_record(business_no: str, *, now: datetime) -> NewRecord:
    record_id = new_id(now)
    return NewRecord(
        id=record_id,
        line="order",
        business_no=business_no,
        source=Source.INTAKE,
        dedup_key=f"test:{record_id}",
        body_sha256="0" * 64,
        payload={"business_no": business_no},
    )


def test_a_write_commits_while_the_line_views_group_by_is_in_progress(harness):
    rt = harness.runtime()
    in_group_by, release = threading.Event(), threading.Event()
    poll_errors: list[BaseException] = []

    def hold_the_read_open(_conn, _cursor, statement, _params, _context, _many) -> None:
        if "GROUP BY" in statement and threading.current_thread().name == "poller":
            in_group_by.set()
            release.wait(timeout=30)

    def poll() -> None:
        try:
            rt.view.line_statuses(now=utcnow())
        except BaseException as exc:  # noqa: BLE001 - reported below
            poll_errors.append(exc)

    committed = threading.Event()

    def write() -> None:
        now = utcnow()
        with rt.journal.transaction() as conn:
            store.insert_record(conn, new_record("W-1", now=now), now=now)
        committed.set()

    event.listen(rt.engine, "after_cursor_execute", hold_the_read_open)
    poller = threading.Thread(target=poll, name="poller", daemon=True)
    writer = threading.Thread(target=write, name="writer", daemon=True)
    try:
        poller.start()
        assert in_group_by.wait(timeout=10), "the line view never ran its GROUP BY"
        writer.start()
        assert committed.wait(timeout=WRITE_WAIT_S), "the write waited for the read to end"
        assert poller.is_alive()  # the read was still open when the write committed
    finally:
        release.set()
        poller.join(timeout=30)
        writer.join(timeout=40)
        event.remove(rt.engine, "after_cursor_execute", hold_the_read_open)
    assert poll_errors == []
    assert harness.record_count() == 1


def test_a_read_transaction_refuses_to_write(harness):
    rt = harness.runtime()
    now = utcnow()
    with pytest.raises(JournalUnavailable), rt.journal.reading() as conn:
        store.insert_record(conn, new_record("R-1", now=now), now=now)
    # The same pooled connection writes again in a write transaction.
    with rt.journal.transaction() as conn:
        store.insert_record(conn, new_record("R-2", now=now), now=now)
    assert [r.business_no for r in harness.records()] == ["R-2"]
    with rt.journal.reading() as conn:
        assert conn.execute(text("SELECT 1")).scalar_one() == 1


def test_many_pollers_run_the_line_views_group_by_at_most_once_a_second(harness):
    rt = harness.runtime()
    now = utcnow()
    with rt.journal.transaction() as conn:
        store.insert_records(conn, [new_record(f"P-{n}", now=now) for n in range(20)], now=now)
    group_bys: list[float] = []

    def count(_conn, _cursor, statement, _params, _context, _many) -> None:
        if "GROUP BY" in statement:
            group_bys.append(time.monotonic())

    pollers, polls_each = 8, 5
    barrier = threading.Barrier(pollers)
    answers: list[int] = []
    errors: list[BaseException] = []

    def poll(n: int) -> None:
        try:
            barrier.wait(timeout=10)
            for _ in range(polls_each):
                if n % 2:
                    rows = rt.view.line_statuses(now=utcnow())
                    answers.append(sum(r.counts.get("received", 0) for r in rows))
                else:  # a Prometheus scrape reads the same view
                    assert b'pipeline_records{line="order",status="received"} 20.0' in render(
                        rt.view, now=utcnow()
                    )
                    answers.append(20)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    event.listen(rt.engine, "before_cursor_execute", count)
    threads = [threading.Thread(target=poll, args=(n,), daemon=True) for n in range(pollers)]
    try:
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        elapsed_s = time.monotonic() - started
    finally:
        event.remove(rt.engine, "before_cursor_execute", count)
    assert errors == []
    assert answers == [20] * (pollers * polls_each)
    # At most one GROUP BY per second begun, however many polls came in that second.
    assert 1 <= len(group_bys) <= 1 + int(elapsed_s), (len(group_bys), elapsed_s)
