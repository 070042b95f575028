"""A line's bound counts records, not messages: a batching line (several records to a
message) bounded at 50 holds at most 50 records on its queue, whatever pushes them (the
intake's group push, the sweeper), and `/v1/lines` reports its depth in records."""

from __future__ import annotations

from collections import Counter

import pytest

from app.clock import utcnow
from app.journal.models import RecordStatus
from app.wiring.runtime import Runtime
from tests.support.harness import Harness
from tests.support.journal import journal_records, new_record
from tests.support.messages import queued_ids

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal

BOUND = 50
# Records per message on the line: 200 records fit in 13 messages, far under a bound of
# 50 counted in messages, and four times a bound of 50 counted in records.
BATCH = 16
RECORDS = 200


def bounded_batching_line(harness: Harness) -> None:
    """`order`, a table-sink line, packs `BATCH` records to a message, bounded at `BOUND`
    (overflow: defer, its default)."""
    harness.configure(
        lines__order__max_queue_length=str(BOUND),
        lines__order__batch_size=str(BATCH),
    )


def accept_in_one_group(rt: Runtime, count: int) -> list[str]:
    """`count` records of `order` committed in one group and pushed together (as the
    intake's group commit pushes concurrent requests): packed into batches. Their ids,
    oldest first."""
    news = [new_record("order", f"B-{n}", now=utcnow()) for n in range(count)]
    rt.acceptor.accept_many(news, clock=utcnow)
    return [new.id for new in news]


def on_queue(rt: Runtime) -> list[str]:
    """The record ids `order`'s messages carry, checked to be there once each."""
    queued = queued_ids(rt.redis, "order")
    twice = {record_id: n for record_id, n in Counter(queued).items() if n > 1}
    assert not twice, f"{len(twice)} records are on the queue more than once"
    return queued


def ids_by_status(harness: Harness, ids: list[str]) -> dict[str, set[str]]:
    """`ids` grouped by their status in the journal."""
    wanted = set(ids)
    grouped: dict[str, set[str]] = {}
    for record_id, status in harness.statuses().items():
        if record_id in wanted:
            grouped.setdefault(status, set()).add(record_id)
    return grouped


def test_a_group_push_puts_at_most_the_bound_in_records_on_the_queue_and_defers_the_rest(
    harness: Harness,
) -> None:
    bounded_batching_line(harness)
    rt = harness.runtime()

    ids = accept_in_one_group(rt, RECORDS)

    queued = on_queue(rt)
    count = len(queued)
    assert 0 < count <= BOUND, f"{count} records on a queue bounded at {BOUND} records"
    grouped = ids_by_status(harness, ids)
    assert set(grouped) <= {RecordStatus.ENQUEUED.value, RecordStatus.DEFERRED.value}
    # Exactly the records on the queue are enqueued; every other one waits, deferred.
    assert grouped.get(RecordStatus.ENQUEUED.value, set()) == set(queued)
    assert grouped.get(RecordStatus.DEFERRED.value, set()) == set(ids) - set(queued)


def test_the_depth_of_v1_lines_counts_the_records_on_the_queue_not_its_messages(
    harness: Harness,
) -> None:
    bounded_batching_line(harness)
    client = harness.start_intake()
    rt = harness.runtime()
    accept_in_one_group(rt, RECORDS)
    count = len(on_queue(rt))
    assert count > 0

    rows = client.get("/v1/lines").json()["lines"]
    (row,) = [row for row in rows if row["line"] == "order"]

    assert row["max_queue_length"] == BOUND
    assert row["queue_depth"] == count, (
        f"/v1/lines reports a depth of {row['queue_depth']} for {count} records on the "
        f"queue ({rt.redis.llen('order')} messages)"
    )


def test_the_sweeper_pushes_deferred_records_up_to_the_bound_in_records_and_no_further(
    harness: Harness,
) -> None:
    bounded_batching_line(harness)
    rt = harness.runtime()
    payloads = [{"business_no": f"D-{n}"} for n in range(RECORDS)]
    ids = journal_records(rt, payloads, line="order", status=RecordStatus.DEFERRED)

    rt.sweeper.sweep(now=utcnow())

    queued = on_queue(rt)
    count = len(queued)
    assert 0 < count <= BOUND, f"one sweep left {count} records on a queue bounded at {BOUND}"
    # The oldest go first; the rest stay deferred in the journal.
    assert set(queued) == set(sorted(ids)[:count])
    grouped = ids_by_status(harness, ids)
    assert grouped.get(RecordStatus.ENQUEUED.value, set()) == set(queued)
    assert grouped.get(RecordStatus.DEFERRED.value, set()) == set(ids) - set(queued)

    # Another sweep, with no worker taking anything, adds no more than the room left.
    rt.sweeper.sweep(now=utcnow())
    assert len(on_queue(rt)) <= BOUND
