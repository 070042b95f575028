"""One clock: the sweeper's thresholds are compared on the database's clock, so a beat
whose own clock runs ahead does not take fresh records for overdue and push them twice."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.clock import utcnow
from app.journal.models import RecordStatus
from tests.support.journal import journal_records

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
