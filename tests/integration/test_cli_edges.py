"""The command line's edges: `--json` on every listing (the HTTP API's document, alone on
stdout), tables that fold at 80 columns rather than cut (a record's whole error), a read
command before the first start (no journal: said, nothing created), and a journal that does
not answer (its setting named, its password hidden)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from app.journal.models import RecordStatus, records
from tests.integration.test_cli import PIPELINE, clean_env
from tests.support.journal import journal_records
from tests.support.processes import REPO, Component, free_port, wait_for

pytestmark = pytest.mark.journal
# How long one `pipeline …` read may take: it starts Python and reads the journal.
CLI_TIMEOUT_S = 60
# A downstream's refusal, as a delivery records it: the status code at its end, and the
# downstream's answer after it. Longer than any cell of an 80-column table.
LONG_ERROR = (
    "DeliveryFailed: POST http://downstream.example.test:8080/v1/orders/ingest?tenant=acme"
    '&mode=strict: HTTP 422 {"error":"business_no ORD-000123 already closed",'
    '"hint":"send a new business_no"}'
)
# Characters of a rich table's frame.
# The last character of each line of a table that is not cut at the terminal's edge.
RIGHT_EDGE = "┓┃┩│┘"
ELLIPSIS = "…"


def pipeline(env: dict[str, str], *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def cli_env(harness, **variables: str) -> dict[str, str]:
    return harness.env | {"PIPELINE_LOG_LEVEL": "WARNING", "COLUMNS": "80"} | variables


def dead_record(harness, error: str = LONG_ERROR) -> str:
    rt = harness.runtime()
    (record_id,) = journal_records(
        rt, [{"business_no": "ORD-000123"}], line="order", status=RecordStatus.DEAD
    )
    with rt.engine.begin() as conn:
        conn.execute(
            update(records).where(records.c.id == record_id).values(last_error=error, attempts=3)
        )
    return record_id


def column_text(output: str, index: int) -> str:
    """The text of a table's `index`th column, its folded lines joined, without the frame
    or spaces: every line of the table (its header's too) split at the frame's vertical
    bars."""
    parts = []
    for line in output.splitlines():
        cells = re.split("[│┃]", line)
        if len(cells) > index + 1:
            parts.append(cells[index + 1])
    return re.sub(r"\s+", "", "".join(parts))


def without_spaces(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_records_list_at_80_columns_folds_the_whole_error_and_cuts_nothing(harness):
    record_id = dead_record(harness)
    run = pipeline(cli_env(harness), "records", "list")
    assert run.returncode == 0, run.stderr
    assert ELLIPSIS not in run.stdout, run.stdout
    assert max(len(line) for line in run.stdout.splitlines()) <= 80, run.stdout
    # id, line, business no, status, attempts, last error, created
    assert without_spaces(LONG_ERROR) in column_text(run.stdout, 5), run.stdout
    assert record_id in column_text(run.stdout, 0)
    assert re.fullmatch(r"created\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", column_text(run.stdout, 6))
    table_lines = [line for line in run.stdout.splitlines() if not line.startswith("next:")]
    assert all(line[-1] in RIGHT_EDGE for line in table_lines), run.stdout
    # Where the terminal is wide enough, the id stays on one line: it is copied.
    wide = pipeline(cli_env(harness, COLUMNS="120"), "records", "list")
    assert wide.returncode == 0, wide.stderr
    assert record_id in wide.stdout
    assert without_spaces(LONG_ERROR) in column_text(wide.stdout, 5), wide.stdout


def test_records_show_and_status_at_80_columns_cut_nothing(harness):
    record_id = dead_record(harness)
    shown = pipeline(cli_env(harness), "records", "show", record_id)
    assert shown.returncode == 0, shown.stderr
    assert ELLIPSIS not in shown.stdout, shown.stdout
    assert without_spaces(LONG_ERROR) in column_text(shown.stdout, 1), shown.stdout
    status = pipeline(cli_env(harness), "status")
    assert status.returncode == 0, status.stderr
    assert ELLIPSIS not in status.stdout, status.stdout
    # Each header whole, if folded: "records / bound (messages)".
    assert "records/bound(messages)" in column_text(status.stdout, 1), status.stdout


def test_json_of_records_list_is_the_apis_document_alone_on_stdout(harness):
    record_id = dead_record(harness)
    client = harness.start_intake()
    api = client.get("/v1/records", params={"limit": 10})
    assert api.status_code == 200, api.text
    run = pipeline(cli_env(harness), "records", "list", "--json", "--limit", "10")
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)  # one document, nothing else on stdout
    assert document == api.json()
    assert document["items"][0]["id"] == record_id
    assert document["items"][0]["last_error"] == LONG_ERROR

    shown = pipeline(cli_env(harness), "records", "show", record_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == client.get(f"/v1/records/{record_id}").json()


def test_json_of_status_audit_and_schedules_is_shaped_as_the_apis(harness):
    dead_record(harness)
    env = cli_env(harness)
    added = pipeline(env, "schedules", "add", "nightly", "--cron", "0 2 * * *", "--line", "order")
    assert added.returncode == 0, added.stderr
    client = harness.start_intake()

    status = json.loads(pipeline(env, "status", "--json").stdout)
    api_lines = client.get("/v1/lines").json()
    assert [line["line"] for line in status["lines"]] == [x["line"] for x in api_lines["lines"]]
    assert set(status["lines"][0]) == set(api_lines["lines"][0])
    assert status["lines"][0]["counts"] == api_lines["lines"][0]["counts"]

    audit = json.loads(pipeline(env, "audit", "--json").stdout)
    assert audit == client.get("/v1/audit").json()
    assert audit["items"][0]["action"] == "schedule_add"

    schedules = json.loads(pipeline(env, "schedules", "list", "--json").stdout)
    api_schedules = client.get("/v1/schedules").json()
    assert [s["name"] for s in schedules["items"]] == ["nightly"]
    assert set(schedules["items"][0]) == set(api_schedules["items"][0])

    replay = pipeline(env, "replay", "--dry-run", "--json")
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout)["dry_run"] is True


@pytest.mark.journal_independent
@pytest.mark.parametrize(
    "command",
    [("status",), ("records", "list"), ("records", "show", "X"), ("audit",), ("schedules", "list")],
)
def test_a_read_before_the_first_start_says_there_is_no_journal_and_creates_none(command, tmp_path):
    run = subprocess.run(
        [PIPELINE, *command],
        cwd=tmp_path,
        env=clean_env(PIPELINE_LOG_LEVEL="WARNING"),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert run.returncode == 1, run.stderr
    expected = f"no journal yet at {tmp_path / 'pipeline.db'}"
    assert expected in run.stderr
    assert "pipeline up" in run.stderr
    assert "OperationalError" not in run.stderr
    assert "Traceback" not in run.stderr
    assert run.stdout == ""
    assert list(tmp_path.iterdir()) == []  # no empty pipeline.db left behind


@pytest.mark.journal_independent
def test_a_journal_that_does_not_answer_is_named_with_its_password_hidden(harness, tmp_path):
    url = "postgresql+psycopg://pipeline:s3cret-pw@127.0.0.1:1/journal"
    for command in (("status",), ("records", "list"), ("audit", "--json")):
        run = pipeline(cli_env(harness, PIPELINE_DATABASE_URL=url), *command, cwd=tmp_path)
        assert run.returncode == 1, run.stderr
        assert "PIPELINE_DATABASE_URL=postgresql+psycopg://pipeline:***@127.0.0.1:1/journal" in (
            run.stderr
        )
        assert "tried connecting to 127.0.0.1:1, database 'journal', as user 'pipeline'" in (
            run.stderr
        )
        assert "s3cret-pw" not in run.stderr + run.stdout
        assert "Traceback" not in run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr


@pytest.mark.journal_independent
def test_an_intake_whose_journal_does_not_answer_says_so_at_its_start(harness, tmp_path):
    url = "postgresql+psycopg://pipeline:s3cret-pw@127.0.0.1:1/journal"
    env = cli_env(harness, PIPELINE_DATABASE_URL=url)
    port = free_port()
    intake = Component(
        ["intake", "--port", str(port)], env=env, log_path=tmp_path / "intake.log"
    ).start()
    try:
        intake.wait_for_output("journal_unreachable", timeout_s=CLI_TIMEOUT_S)

        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answers, timeout_s=CLI_TIMEOUT_S, what="the intake to run on")
    finally:
        intake.stop(timeout_s=10)
    output = intake.output()
    assert "PIPELINE_DATABASE_URL=postgresql+psycopg://pipeline:***@127.0.0.1:1/journal" in output
    assert "s3cret-pw" not in output
    assert "Traceback" not in output


def test_json_of_retry_and_cancel_is_what_the_api_answers(harness):
    record_id = dead_record(harness)
    env = cli_env(harness)
    client = harness.start_intake()
    counted = pipeline(env, "records", "retry", "--dead", "--dry-run", "--json")
    assert counted.returncode == 0, counted.stderr
    api = client.post("/v1/records/retry", json={"status": ["dead"], "dry_run": True})
    assert api.status_code == 200, api.text
    assert json.loads(counted.stdout) == api.json()

    retried = pipeline(env, "records", "retry", record_id, "--json")
    assert retried.returncode == 0, retried.stderr
    document = json.loads(retried.stdout)
    assert document["id"] == record_id
    assert set(document) == set(client.get(f"/v1/records/{record_id}").json()) - {
        "attempt_history",
        "audit",
    }
