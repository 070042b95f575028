"""Replay skips what downstream already has: a table row written by the
record itself, or one holding the same payload; a status no newer than the one stored.
The rest goes back on its queue."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import insert, update

from app.clock import utcnow
from app.config.settings import load_settings
from app.errors import ConfigError
from app.journal.models import RecordStatus, order_status, orders, records
from app.recovery import replay
from app.recovery.replay import ReplayFilter
from tests.support.journal import journal_records
from tests.support.messages import queued_ids
from tests.support.recorder import KnownIds, Received

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal


def journal_dead(rt, line: str, payloads: list[dict]) -> list[str]:
    return journal_records(rt, payloads, line=line, status=RecordStatus.DEAD)


def test_replay_skips_order_rows_downstream_has_and_enqueues_the_rest(harness):
    rt = harness.runtime()
    own, same, other, absent = journal_dead(
        rt,
        "order",
        [{"business_no": f"O-{n}", "amount": n} for n in range(4)],
    )
    now = utcnow()
    with rt.engine.begin() as conn:
        conn.execute(
            insert(orders),
            [
                # Written by the record itself.
                {
                    "business_no": "O-0",
                    "record_id": own,
                    "payload": {"business_no": "O-0", "amount": 0},
                    "updated_at": now,
                },
                # Written by another record with the same content.
                {
                    "business_no": "O-1",
                    "record_id": "another",
                    "payload": {"business_no": "O-1", "amount": 1},
                    "updated_at": now,
                },
                # Written by another record with other content: not this one's effect.
                {
                    "business_no": "O-2",
                    "record_id": "another",
                    "payload": {"business_no": "O-2", "amount": 99},
                    "updated_at": now,
                },
            ],
        )

    counts = rt.replayer.replay(
        ReplayFilter(line="order"), dry_run=False, actor="test", clock=utcnow
    )

    assert (counts.matched, counts.skipped_synced, counts.enqueued) == (4, 2, 2)
    assert set(queued_ids(rt.redis, "order")) == {other, absent}
    statuses = {r.id: r.status for r in harness.records()}
    assert statuses == {
        own: RecordStatus.DONE,
        same: RecordStatus.DONE,
        other: RecordStatus.ENQUEUED,
        absent: RecordStatus.ENQUEUED,
    }


def test_replay_skips_a_status_no_newer_than_the_stored_one(harness):
    rt = harness.runtime()
    stored_at = utcnow() - timedelta(hours=1)
    older, newer = journal_dead(
        rt,
        "status",
        [
            {
                "business_no": "S-1",
                "status": "paid",
                "occurred_at": (stored_at - timedelta(minutes=5)).isoformat(),
            },
            {
                "business_no": "S-2",
                "status": "shipped",
                "occurred_at": (stored_at + timedelta(minutes=5)).isoformat(),
            },
        ],
    )
    with rt.engine.begin() as conn:
        conn.execute(
            insert(order_status),
            [
                {
                    "business_no": no,
                    "record_id": "another",
                    "status": "packed",
                    "occurred_at": stored_at,
                    "updated_at": stored_at,
                }
                for no in ("S-1", "S-2")
            ],
        )

    counts = rt.replayer.replay(
        ReplayFilter(line="status"), dry_run=False, actor="test", clock=utcnow
    )

    assert (counts.matched, counts.skipped_synced, counts.enqueued) == (2, 1, 1)
    assert queued_ids(rt.redis, "status") == [newer]
    assert {r.id: r.status for r in harness.records()} == {
        older: RecordStatus.DONE,
        newer: RecordStatus.ENQUEUED,
    }


def test_replay_asks_downstream_per_record_id_so_a_second_record_of_a_business_no_is_sent(
    harness,
):
    """Two refunds of one business number: downstream has the first, not the second, which
    is dead. Asked per business number, downstream would say yes for both; asked per
    record id (the Idempotency-Key it was sent), it says which one it has."""
    rt_setup = harness.runtime()
    (first,) = journal_records(
        rt_setup, [{"business_no": "R-1", "amount": 10}], line="refund", status=RecordStatus.DONE
    )
    second, lost_answer = journal_dead(
        rt_setup,
        "refund",
        [{"business_no": "R-1", "amount": 5}, {"business_no": "R-2", "amount": 7}],
    )
    # R-2 reached downstream, but its answer never reached us: downstream has it.
    downstream = KnownIds({first, lost_answer}).start()
    try:
        harness.configure(
            lines__refund__downstream_url=f"{downstream.url}/refunds",
            lines__refund__check_url=f"{downstream.url}/records/{{id}}?business_no={{business_no}}",
        )
        rt = harness.runtime()
        counts = rt.replayer.replay(
            ReplayFilter(line="refund"), dry_run=False, actor="test", clock=utcnow
        )
    finally:
        downstream.stop()

    assert (counts.matched, counts.skipped_synced, counts.enqueued) == (2, 1, 1)
    assert queued_ids(rt.redis, "refund") == [second]
    assert {r.id: r.status for r in harness.records()} == {
        first: RecordStatus.DONE,
        second: RecordStatus.ENQUEUED,
        lost_answer: RecordStatus.DONE,
    }
    asked = sorted((r.path, r.query.get("business_no")) for r in downstream.snapshot())
    assert asked == sorted([(f"/records/{second}", "R-1"), (f"/records/{lost_answer}", "R-2")])


@pytest.mark.journal_independent
@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:9/refunds/{business_no}", "http://127.0.0.1:9/records/"]
)
def test_a_check_url_that_does_not_name_the_record_id_is_refused(monkeypatch, url):
    monkeypatch.setenv("PIPELINE_LINES__REFUND__CHECK_URL", url)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "PIPELINE_LINES__REFUND__CHECK_URL" in str(caught.value)
    assert "{id}" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_rejected_records_are_replayed_only_when_asked_for(harness):
    """A rejected record's caller was answered 429 and may have sent it again: replaying it
    by default could deliver it twice."""
    rt = harness.runtime()
    (rejected,) = journal_records(
        rt, [{"business_no": "O-R"}], line="order", status=RecordStatus.REJECTED
    )

    counts = rt.replayer.replay(
        ReplayFilter(line="order"), dry_run=False, actor="test", clock=utcnow
    )
    assert (counts.matched, counts.enqueued) == (0, 0)
    assert queued_ids(rt.redis, "order") == []
    assert [r.status for r in harness.records()] == [RecordStatus.REJECTED]

    asked = ReplayFilter(line="order", statuses=[RecordStatus.REJECTED])
    counts = rt.replayer.replay(asked, dry_run=False, actor="test", clock=utcnow)
    assert (counts.matched, counts.enqueued) == (1, 1)
    assert queued_ids(rt.redis, "order") == [rejected]
    assert [r.status for r in harness.records()] == [RecordStatus.ENQUEUED]


def test_two_replays_at_once_push_each_record_once(harness):
    rt = harness.runtime()
    other = harness.runtime()  # a second operator's replay, with its own connections
    ids = journal_dead(rt, "refund", [{"business_no": f"T-{n}"} for n in range(3000)])
    barrier = threading.Barrier(2)
    results = []

    def run(runtime) -> None:
        barrier.wait(timeout=10)
        results.append(
            runtime.replayer.replay(
                ReplayFilter(line="refund"), dry_run=False, actor="t", clock=utcnow
            )
        )

    threads = [threading.Thread(target=run, args=(r,)) for r in (rt, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 2
    assert Counter(queued_ids(rt.redis, "refund")) == Counter(ids)  # each once, none twice
    assert sum(r.enqueued for r in results) == len(ids)
    # What one replay pushed, the other met as in flight (or never saw as dead).
    assert all(r.enqueued + r.skipped_in_flight <= r.matched for r in results)


def test_replay_over_many_pages_pushes_oldest_first_and_defers_what_the_bound_leaves(
    harness, monkeypatch
):
    """Pages are claimed ahead of the push of the page before them (on PostgreSQL): the
    pushes keep the journal's order, and what the queue's bound leaves waits `deferred`."""
    monkeypatch.setattr(replay, "PAGE_SIZE", 2)  # seven records: four pages
    harness.configure(
        lines__refund__max_queue_length="4",
        lines__refund__batch_size="1",
        lines__refund__sender_queue_share="1",
    )
    rt = harness.runtime()
    # In the journal's order (ids made in one millisecond do not sort as they were made).
    ids = sorted(journal_dead(rt, "refund", [{"business_no": f"P-{n}"} for n in range(7)]))

    counts = rt.replayer.replay(
        ReplayFilter(line="refund"), dry_run=False, actor="test", clock=utcnow
    )

    assert (counts.matched, counts.enqueued, counts.deferred) == (7, 4, 3)
    assert queued_ids(rt.redis, "refund") == ids[:4]
    statuses = {r.id: r.status for r in harness.records()}
    assert [statuses[i] for i in ids] == [RecordStatus.ENQUEUED] * 4 + [RecordStatus.DEFERRED] * 3


class ChangesTheJournal(KnownIds):
    """A downstream's check endpoint that has none of the ids it is asked about, and that
    runs `change` when it is first asked: the journal changes between replay's read of a
    page and its claim of it."""

    def __init__(self, change: Callable[[], None]) -> None:
        super().__init__(set())
        self.change: Callable[[], None] | None = change

    def answer(self, method: str, received: Received) -> int:
        change, self.change = self.change, None
        if change is not None:
            change()
        return super().answer(method, received)


def test_a_record_finished_or_leased_after_its_page_was_read_is_not_claimed(harness):
    """Replay reads a page, asks downstream, then claims: meanwhile one record of the page
    was delivered and another's attempt took its lease. The claim's guard (status as read,
    no live lease) leaves both alone; only the third is pushed."""
    rt = harness.runtime()
    done, leased, untouched = journal_records(
        rt,
        [{"business_no": f"L-{n}"} for n in range(3)],
        line="refund",
        status=RecordStatus.DEFERRED,
    )

    def worker_meanwhile() -> None:
        with rt.engine.begin() as conn:
            conn.execute(
                update(records)
                .where(records.c.id == done)
                .values(status=RecordStatus.DONE.value, finished_at=utcnow())
            )
            conn.execute(
                update(records)
                .where(records.c.id == leased)
                .values(lease_owner="w1", lease_expires_at=utcnow() + timedelta(minutes=5))
            )

    downstream = ChangesTheJournal(worker_meanwhile).start()
    try:
        harness.configure(
            lines__refund__downstream_url=f"{downstream.url}/refunds",
            lines__refund__check_url=f"{downstream.url}/records/{{id}}",
        )
        counts = harness.runtime().replayer.replay(
            ReplayFilter(line="refund"), dry_run=False, actor="test", clock=utcnow
        )
    finally:
        downstream.stop()

    assert (counts.matched, counts.enqueued, counts.skipped_in_flight) == (3, 1, 2)
    assert queued_ids(rt.redis, "refund") == [untouched]
    after = {r.id: r for r in harness.records()}
    assert after[done].status is RecordStatus.DONE
    assert (after[leased].status, after[leased].lease_owner) == (RecordStatus.DEFERRED, "w1")
    assert after[untouched].status is RecordStatus.ENQUEUED
