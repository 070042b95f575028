"""One record to a message, on a line with the table sink: the engine claims the attempt,
writes the sink row and marks the record done in one transaction. What that must get
right: a record the sink refuses, a record out of attempts, one already done, and one of
another line than the queue it came from."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from app.clock import utcnow
from app.journal.models import RecordStatus, records
from tests.support.journal import journal_records, run_record

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal


def run(rt, record_id: str, line: str) -> RecordStatus | None:
    return run_record(rt, record_id, line=line)


def test_a_record_the_sink_refuses_fails_with_one_attempt_and_leaves_no_row(harness):
    rt = harness.runtime()
    occurred = utcnow().isoformat()
    payloads = [
        {"business_no": "R-good", "status": "paid", "occurred_at": occurred},
        {"business_no": "R-bad"},  # no status: the sink cannot write it
        # Longer than the status column: PostgreSQL refuses the statement, which aborts
        # the transaction; SQLite stores it.
        {"business_no": "R-long", "status": "x" * 100, "occurred_at": occurred},
    ]
    ids = journal_records(rt, payloads, line="status", status=RecordStatus.ENQUEUED)
    strict = not harness.env["PIPELINE_DATABASE_URL"].startswith("sqlite")

    outcomes = [run(rt, record_id, "status") for record_id in ids]

    long_outcome = RecordStatus.FAILED if strict else RecordStatus.DONE
    assert outcomes == [RecordStatus.DONE, RecordStatus.FAILED, long_outcome]
    stored = {r.id: r for r in harness.records()}
    assert [(stored[i].status, stored[i].attempts) for i in ids] == [
        (RecordStatus.DONE, 1),
        (RecordStatus.FAILED, 1),
        (long_outcome, 1),
    ]
    assert "KeyError" in (stored[ids[1]].last_error or "")
    assert stored[ids[0]].finished_at is not None
    assert stored[ids[1]].finished_at is None
    rows = {row[0] for row in harness.rows("SELECT business_no FROM order_status")}
    assert rows == ({"R-good"} if strict else {"R-good", "R-long"})


def test_records_out_of_attempts_done_or_of_another_line_are_not_finished_by_it(harness):
    harness.configure(lines__order__max_attempts="3", lines__status__max_attempts="1")
    rt = harness.runtime()
    payloads = [{"business_no": f"O-{n}"} for n in range(3)]
    spent, done, ready = journal_records(rt, payloads, line="order", status=RecordStatus.ENQUEUED)
    occurred = utcnow().isoformat()
    (elsewhere,) = journal_records(
        rt,
        [{"business_no": "O-9", "status": "paid", "occurred_at": occurred}],
        line="status",
        status=RecordStatus.ENQUEUED,
    )
    with rt.engine.begin() as conn:
        # Each of their attempts killed its worker before it could report back: the order
        # record has used its 3, the status record its 1 (the order line would allow 3).
        conn.execute(update(records).where(records.c.id == spent).values(attempts=3))
        conn.execute(update(records).where(records.c.id == elsewhere).values(attempts=1))

    assert run(rt, done, "order") is RecordStatus.DONE
    assert run(rt, done, "order") is None  # delivered again: nothing to run
    assert run(rt, spent, "order") is RecordStatus.DEAD
    # Found on the order queue, it is still a status record, with the status line's rules.
    assert run(rt, elsewhere, "order") is RecordStatus.DEAD
    assert run(rt, ready, "order") is RecordStatus.DONE

    stored = {r.id: r for r in harness.records()}
    assert (stored[done].status, stored[done].attempts) == (RecordStatus.DONE, 1)
    assert (stored[spent].status, stored[spent].attempts) == (RecordStatus.DEAD, 4)
    assert (stored[elsewhere].status, stored[elsewhere].attempts) == (RecordStatus.DEAD, 2)
    assert "lost on every attempt" in (stored[spent].last_error or "")
    orders = {row[0] for row in harness.rows("SELECT business_no FROM orders")}
    assert orders == {"O-1", "O-2"}
    assert harness.rows("SELECT business_no FROM order_status") == []
