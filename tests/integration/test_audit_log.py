"""The audit log's rows: written in the caller's transaction, read newest first by pages."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.clock import utcnow
from app.journal import audit
from app.journal.audit import Action

pytestmark = pytest.mark.journal


def test_rows_are_read_newest_first_a_page_at_a_time(harness):
    rt = harness.runtime()
    start = utcnow()
    with rt.journal.transaction() as conn:
        written = [
            audit.write(
                conn,
                actor="alice",
                action=Action.CANCEL,
                target=f"record:{n}",
                params={"n": n},
                result={"cancelled": 1},
                reason="x" * 600 if n == 0 else None,
                now=start + timedelta(seconds=n),
            )
            for n in range(3)
        ]
    with rt.journal.reading() as conn:
        first = audit.newest(conn, limit=2)
        second = audit.newest(conn, limit=2, before=first[-1].id)
    assert [e.id for e in first + second] == [w.id for w in reversed(written)]
    oldest = second[0]
    assert (oldest.actor, oldest.action, oldest.target) == ("alice", Action.CANCEL, "record:0")
    assert (oldest.params, oldest.result) == ({"n": 0}, {"cancelled": 1})
    assert oldest.reason == "x" * audit.MAX_REASON_LENGTH
    assert oldest.public()["time"] == start.isoformat()


def _pause_that_fails(conn) -> None:
    audit.write(
        conn,
        actor="cli:root",
        action=Action.PAUSE,
        target="line:order",
        params={},
        result=None,
        reason=None,
        now=utcnow(),
    )
    raise RuntimeError("the action failed")


def test_a_row_is_not_kept_when_its_transaction_rolls_back(harness):
    rt = harness.runtime()
    with pytest.raises(RuntimeError), rt.journal.transaction() as conn:
        _pause_that_fails(conn)
    with rt.journal.reading() as conn:
        assert audit.newest(conn, limit=10) == []
