"""The attempts of a record: one row each, written with the attempt's outcome, shown by
`GET /v1/records/{id}` as `attempt_history`, kept through a replay, deleted with their
record by retention. Attempts run in the test's process, against a real downstream."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from app.clock import utcnow
from app.journal import attempt_log
from app.journal.attempt_log import Outcome, new_attempt
from app.journal.engine import make_engine
from app.journal.models import RecordStatus, metadata
from app.journal.schema import SCRIPT_LOCATION, upgrade
from app.recovery.replay import ReplayFilter
from tests.support.handlers import TAKEOVER_OWNER
from tests.support.journal import force_status, journal_records, run_record, run_records
from tests.support.recorder import Recorder, SilentServer

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal


def run(rt, record_id: str) -> RecordStatus | None:
    return run_record(rt, record_id)


def retry_due(rt, record_id: str) -> None:
    """Put a failed record back on its way, as the sweeper does when its retry is due."""
    with rt.journal.transaction() as conn:
        force_status(conn, [record_id], RecordStatus.ENQUEUED)


def history(rt, record_id: str) -> list[attempt_log.Attempt]:
    with rt.journal.reading() as conn:
        return attempt_log.history(conn, record_id)


def test_a_downstream_answering_500_then_200_shows_every_attempt_through_a_replay(harness):
    downstream = Recorder(status=500).start()
    try:
        harness.configure(
            lines__shipment__downstream_url=f"{downstream.url}/in",
            lines__shipment__max_attempts="2",
        )
        rt = harness.runtime()
        (record_id,) = journal_records(
            rt, [{"business_no": "SH-1"}], line="shipment", status=RecordStatus.ENQUEUED
        )
        assert run(rt, record_id) is RecordStatus.FAILED
        retry_due(rt, record_id)
        assert run(rt, record_id) is RecordStatus.DEAD
        # A replay starts the count of attempts again; the history keeps every attempt.
        downstream.status = 200
        where = ReplayFilter(line="shipment", statuses=[RecordStatus.DEAD])
        assert rt.replayer.replay(where, dry_run=False, actor="test", clock=utcnow).enqueued == 1
        assert run(rt, record_id) is RecordStatus.DONE
        client = harness.start_intake()

        shown = client.get(f"/v1/records/{record_id}").json()

        assert (shown["status"], shown["attempts"], shown["next_attempt_at"]) == ("done", 1, None)
        first, second, third = shown["attempt_history"]
        assert [(a["attempt"], a["outcome"], a["http_status"]) for a in (first, second, third)] == [
            (1, "failed", 500),
            (2, "failed", 500),
            (1, "done", 200),
        ]
        assert (first["error_class"], second["error_class"]) == ("DeliveryFailed",) * 2
        assert first["error_message"] == f"POST {downstream.url}/in: HTTP 500"
        assert (third["error_class"], third["error_message"]) == (None, None)
        assert first["worker"] == {"host": socket.gethostname(), "pid": os.getpid()}
        assert first["started_at"] <= first["finished_at"] <= second["started_at"]
        assert all(a["duration_ms"] >= 0 for a in shown["attempt_history"])
        # The list of records shows no history (one read per record), but the next attempt.
        listed = client.get("/v1/records", params={"line": "shipment"}).json()["items"]
        assert "attempt_history" not in listed[0]
        assert listed[0]["next_attempt_at"] is None
    finally:
        downstream.stop()


def test_a_downstream_that_does_not_answer_in_time_shows_a_timeout(harness):
    silent = SilentServer()
    try:
        harness.configure(
            lines__shipment__downstream_url=silent.url, lines__shipment__delivery_timeout_s="0.3"
        )
        rt = harness.runtime()
        (record_id,) = journal_records(
            rt, [{"business_no": "SH-2"}], line="shipment", status=RecordStatus.ENQUEUED
        )
        assert run(rt, record_id) is RecordStatus.FAILED
    finally:
        silent.stop()
    client = harness.start_intake()
    shown = client.get(f"/v1/records/{record_id}").json()
    [attempt] = shown["attempt_history"]
    assert (attempt["outcome"], attempt["http_status"]) == ("timeout", None)
    assert attempt["error_class"] == "DeliveryFailed"
    assert "no whole answer within 0.3 s" in attempt["error_message"]
    assert shown["status"] == "failed"
    assert shown["next_attempt_at"] is not None  # the journal's retry, as before


def test_the_table_sink_writes_a_row_per_attempt_alone_and_in_a_batch(harness):
    rt = harness.runtime()
    occurred = utcnow().isoformat()
    good = {"status": "paid", "occurred_at": occurred}
    payloads = [
        {"business_no": "T-1", **good},
        {"business_no": "T-2"},  # no status: the sink refuses it
        {"business_no": "T-3", **good},
    ]
    batch = journal_records(rt, payloads, line="status", status=RecordStatus.ENQUEUED)
    (alone,) = journal_records(
        rt, [{"business_no": "T-4", **good}], line="status", status=RecordStatus.ENQUEUED
    )

    statuses = run_records(rt, batch, line="status")
    by_claim = run_record(rt, alone, line="status")

    assert statuses == [RecordStatus.DONE, RecordStatus.FAILED, RecordStatus.DONE]
    assert by_claim is RecordStatus.DONE
    rows = {record_id: history(rt, record_id) for record_id in [*batch, alone]}
    assert [[(a.attempt, a.outcome) for a in rows[i]] for i in [*batch, alone]] == [
        [(1, Outcome.DONE)],
        [(1, Outcome.FAILED)],
        [(1, Outcome.DONE)],
        [(1, Outcome.DONE)],
    ]
    refused = rows[batch[1]][0]
    assert (refused.error_class, refused.error_message) == ("KeyError", "'status'")


def test_an_attempt_that_lost_its_lease_writes_lease_lost_and_changes_no_record(harness):
    harness.configure(lines__order__handler="tests.support.handlers:taken_over")
    rt = harness.runtime()
    (record_id,) = journal_records(
        rt, [{"business_no": "L-1"}], line="order", status=RecordStatus.ENQUEUED
    )

    assert run(rt, record_id) is None  # its outcome was ignored

    [record] = harness.records()
    assert (record.status, record.attempts, record.lease_owner) == (
        RecordStatus.ENQUEUED,
        2,
        TAKEOVER_OWNER,
    )
    [attempt] = history(rt, record_id)
    assert (attempt.attempt, attempt.outcome, attempt.error_class) == (1, Outcome.LEASE_LOST, None)


def test_retention_deletes_the_attempts_of_the_records_it_deletes_only(harness):
    harness.configure(retention_days="1")
    rt = harness.runtime()
    old = utcnow() - timedelta(days=3)
    expired, kept = journal_records(
        rt,
        [{"business_no": "R-1"}, {"business_no": "R-2"}],
        line="order",
        status=RecordStatus.DONE,
    )
    with rt.journal.transaction() as conn:
        conn.exec_driver_sql(
            "UPDATE records SET finished_at = %s WHERE id = %s"
            if conn.dialect.name == "postgresql"
            else "UPDATE records SET finished_at = ? WHERE id = ?",
            (old, expired),
        )
        force_status(conn, [kept], RecordStatus.DEAD)
        attempt_log.write(
            conn,
            [
                new_attempt(
                    record_id=record_id,
                    attempt=1,
                    started_at=old,
                    finished_at=old,
                    worker=("host", 1),
                    outcome=Outcome.FAILED,
                    error=RuntimeError("down"),
                )
                for record_id in (expired, kept)
            ],
        )

    assert rt.retention.purge(now=utcnow()) == 1

    assert [r.id for r in harness.records()] == [kept]
    assert history(rt, expired) == []
    assert [a.error_message for a in history(rt, kept)] == ["down"]


def test_the_migrations_build_the_tables_the_models_describe_and_0008_goes_back(database_url):
    engine = make_engine(database_url)  # the fixture's database is migrated already
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, metadata) == []
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0007")
        with engine.connect() as conn:
            assert "record_attempts" not in inspect(conn).get_table_names()
        upgrade(engine)
        with engine.connect() as conn:
            indexes = inspect(conn).get_indexes("record_attempts")
        assert [(i["name"], i["column_names"]) for i in indexes] == [
            ("ix_record_attempts_record_id_id", ["record_id", "id"])
        ]
    finally:
        engine.dispose()
