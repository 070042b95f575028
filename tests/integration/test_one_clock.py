"""One clock: the sweeper's thresholds are compared on the database's clock, so a beat
whose own clock runs ahead does not take fresh records for overdue and push them twice."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from app.clock import utcnow
from app.journal.models import RecordStatus
from tests.support.journal import journal_records, new_record
from tests.support.messages import queued_ids
from tests.support.processes import wait_for

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal


def test_a_beat_whose_clock_runs_5_s_ahead_pushes_no_fresh_record(harness, database_url):
    if not database_url.startswith("postgresql"):
        pytest.skip(
            "PostgreSQL only: every process of a SQLite journal shares its one host's clock"
        )
    harness.configure(received_grace_seconds="2")
    rt = harness.runtime()
    fresh = journal_records(
        rt,
        [{"business_no": f"C-{n}"} for n in range(5)],
        line="order",
        status=RecordStatus.RECEIVED,
    )
    ahead = utcnow() + timedelta(seconds=5)  # this beat's clock
    result = rt.sweeper.sweep(now=ahead)
    assert result.enqueued == {}
    assert rt.redis.llen("order") == 0
    assert {r.status for r in harness.records()} == {RecordStatus.RECEIVED}
    assert len(fresh) == 5


@pytest.mark.parametrize("offset_s", [-30, 30], ids=["30-s-behind", "30-s-ahead"])
def test_an_intake_whose_clock_is_off_by_30_s_neither_doubles_nor_delays_a_push(
    harness, database_url, offset_s
):
    """The times the journal writes are the database's too: a record an intake whose clock
    is 30 s behind committed is not taken by the sweeper at once, as if its grace were over
    (the intake may be pushing it: a double push), and one committed by an intake 30 s
    ahead is taken after its grace, not 30 s later."""
    if not database_url.startswith("postgresql"):
        pytest.skip(
            "PostgreSQL only: every process of a SQLite journal shares its one host's clock"
        )
    harness.configure(received_grace_seconds="2")
    rt = harness.runtime()
    news = [new_record("order", f"K-{n}", now=utcnow()) for n in range(5)]

    def intake_clock() -> datetime:
        return utcnow() + timedelta(seconds=offset_s)

    # Committed, not pushed yet: the intake's push is still on its way (or Redis was down).
    rt.acceptor.journal_many(news, clock=intake_clock)
    assert rt.sweeper.sweep(now=utcnow()).enqueued == {}
    assert rt.redis.llen("order") == 0
    # Past the grace, on the database's clock: pushed, once.
    wait_for(
        lambda: rt.sweeper.sweep(now=utcnow()).enqueued == {"order": 5},
        timeout_s=10,
        what="the sweeper to push the records after their grace",
    )
    assert sorted(queued_ids(rt.redis, "order")) == sorted(new.id for new in news)
