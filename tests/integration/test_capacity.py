"""`python -m tests.capacity` at small sizes: each part measures what it says, on a
real journal, a real Redis and a real worker delivering to a real HTTP server. Nothing
here looks at how fast anything was."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.pool import NullPool

from app.journal.models import record_attempts, records
from app.local.embedded_redis import answers
from tests.capacity import cli as capacity
from tests.capacity.intake import measure_intake
from tests.capacity.journal import measure_journal, scratch_database
from tests.capacity.redis_memory import measure_waiting, redis_server
from tests.capacity.worker import WorkerRun, measure_worker
from tests.conftest import PG_ADMIN_URL
from tests.support.processes import REPO


def _quiet(_message: str) -> None:
    return


@pytest.mark.journal
def test_journal_sizes_name_every_table_and_index_of_the_records(database_url):
    figures = measure_journal(database_url, records=1_200, progress=_quiet)
    assert figures["records"] == 1_200
    # One attempt each, and a failed one before it for each tenth.
    assert figures["attempts"] == 1_320
    assert 300 < figures["payload_json_bytes_mean"] < 600
    engine = create_engine(database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            statuses = conn.execute(text("SELECT status, count(*) FROM records GROUP BY status"))
            assert dict(statuses.all()) == {"done": 1_200}
        schema = inspect(engine)
        indexes = {
            index["name"]
            for table in (records, record_attempts)
            for index in schema.get_indexes(table.name)
        }
    finally:
        engine.dispose()
    for stage in ("lived", "compact"):
        sizes = figures[stage]
        assert {"records", "record_attempts"} <= set(sizes)
        assert indexes <= set(sizes), f"{stage}: {indexes - set(sizes)} not measured"
        assert all(entry["bytes"] > 0 for entry in sizes.values()), sizes
        assert {entry["table"] for entry in sizes.values()} == {"records", "record_attempts"}
    # Compacting never makes a table bigger.
    for table in ("records", "record_attempts"):
        assert figures["compact"][table]["bytes"] <= figures["lived"][table]["bytes"]


@pytest.mark.journal
def test_a_scratch_database_is_made_migrated_and_dropped(tmp_path):
    server = PG_ADMIN_URL or "sqlite"
    with scratch_database(server, tmp_path) as url:
        engine = create_engine(url, poolclass=NullPool)
        try:
            assert {"records", "record_attempts"} <= set(inspect(engine).get_table_names())
        finally:
            engine.dispose()
    if not PG_ADMIN_URL:
        return
    name = url.rsplit("/", 1)[1]
    admin = create_engine(PG_ADMIN_URL, poolclass=NullPool)
    try:
        with admin.connect() as conn:
            found = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name})
            assert found.first() is None
    finally:
        admin.dispose()


def test_its_redis_server_answers_and_is_stopped_after(tmp_path):
    with redis_server(tmp_path) as (url, server):
        assert answers(url)
        assert server.split()[0] in {"redis", "valkey"}
    assert not answers(url)


def test_waiting_messages_are_counted_and_their_memory_measured(redis_url):
    single = measure_waiting(redis_url, messages=300)
    assert single["messages"] == 300
    assert single["records_per_message"] == 1
    # A message as kombu stores it: the body, headers and properties of a Celery task.
    assert single["message_bytes"] > 500
    assert single["bytes_per_message"] >= single["message_bytes"] / 2
    batched = measure_waiting(redis_url, messages=20, batch_size=16)
    assert batched["messages"] == 20
    assert batched["message_bytes"] > single["message_bytes"]


@pytest.mark.journal
@pytest.mark.timeout(180)
def test_a_worker_delivers_every_record_once_to_the_downstream(database_url, redis_url, tmp_path):
    run = WorkerRun(latency_ms=20, concurrency=2, records=12)
    figures = measure_worker(
        run, redis_url=redis_url, database_url=database_url, workdir=tmp_path, progress=_quiet
    )
    assert figures["records"] == 12
    assert figures["downstream_posts"] == figures["downstream_distinct_keys"] == 12
    assert figures["records_per_s"] > 0
    assert figures["worker_cpu_ms_per_record"] > 0
    assert figures["pss_mib_parent"] > 0
    assert figures["pss_mib_per_pool_process"] > 0


def test_bad_arguments_get_one_clear_line_and_no_traceback():
    done = subprocess.run(
        [sys.executable, "-m", "tests.capacity", "--records", "0", "--part", "redis"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert "--records: must be at least 1, not 0" in done.stderr
    assert "Traceback" not in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "tests.capacity", "--part", "disk"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert "invalid choice: 'disk'" in done.stderr


def test_a_database_that_does_not_answer_is_one_line_and_exit_1(tmp_path, capsys):
    # Nothing listens on port 9 of loopback (the discard port is not served here).
    url = "postgresql+psycopg://nobody@127.0.0.1:9/none"
    assert capacity.main(["--part", "journal", "--database-url", url, "--records", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("capacity: OperationalError: ")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.journal
@pytest.mark.timeout(180)
def test_the_intake_answers_every_request_and_its_cpu_is_measured(
    database_url, redis_url, tmp_path
):
    figures = measure_intake(
        redis_url=redis_url,
        database_url=database_url,
        workdir=tmp_path,
        requests=40,
        progress=_quiet,
    )
    assert figures["requests"] == 40
    assert figures["non_2xx"] == 0
    assert figures["cpu_ms_per_request"] > 0
    engine = create_engine(database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            # The warm-up's 4 and the 40 measured, each journaled once.
            assert conn.execute(text("SELECT count(*) FROM records")).scalar_one() == 44
    finally:
        engine.dispose()


def test_saved_figures_combine_into_the_plan(tmp_path, capsys):
    journal = {"database": "postgresql", "records": 10, "attempts": 11}
    journal["lived"] = journal["compact"] = {
        "records": {"kind": "table", "table": "records", "bytes": 8, "total_bytes": 15},
        "record_attempts": {
            "kind": "table",
            "table": "record_attempts",
            "bytes": 2,
            "total_bytes": 3,
        },
    }
    worker = {
        "latency_ms": 0,
        "concurrency": 1,
        "records_per_s": 100.0,
        "worker_cpu_ms_per_record": 4.0,
    }
    first, second = tmp_path / "journal.json", tmp_path / "worker.json"
    first.write_text(json.dumps({"measured_at": "a", "command": "x", "journal": [journal]}))
    second.write_text(json.dumps({"measured_at": "b", "command": "y", "worker": [worker]}))
    assert capacity.main(["--combine", str(first), "--combine", str(second)]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["runs"] == [
        {"measured_at": "a", "command": "x"},
        {"measured_at": "b", "command": "y"},
    ]
    assert figures["plan"]["pool_processes_at_peak"] == {"0": 4, "50": 21, "200": 73}
    assert capacity.main(["--combine", str(tmp_path / "missing.json")]) == 1
    assert "capacity: cannot combine: FileNotFoundError" in capsys.readouterr().err
