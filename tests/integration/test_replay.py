"""Replay skips what downstream already has (DESIGN §7): a table row written by the
record itself, or one holding the same payload; a status no newer than the one stored.
The rest goes back on its queue."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import insert

from app.clock import utcnow
from app.journal.models import RecordStatus, order_status, orders
from app.replay import ReplayFilter, replay
from tests.support.journal import journal_records
from tests.support.messages import queued_ids


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

    counts = replay(rt, ReplayFilter(line="order"), dry_run=False, actor="test", clock=utcnow)

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

    counts = replay(rt, ReplayFilter(line="status"), dry_run=False, actor="test", clock=utcnow)

    assert (counts.matched, counts.skipped_synced, counts.enqueued) == (2, 1, 1)
    assert queued_ids(rt.redis, "status") == [newer]
    assert {r.id: r.status for r in harness.records()} == {
        older: RecordStatus.DONE,
        newer: RecordStatus.ENQUEUED,
    }
