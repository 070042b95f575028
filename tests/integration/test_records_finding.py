"""Finding records: the filters of `GET /v1/records` (error words as plain text, in any
case, attempt counts) with clear 422s, and `pipeline records …` on the command line:
keyset pages with the cursor it prints, and retry and cancel by id or by filter."""

from __future__ import annotations

import getpass
import re
import subprocess
import sys

import pytest
from sqlalchemy import update

from app.journal import audit
from app.journal.models import RecordStatus, records
from tests.support.journal import journal_records
from tests.support.processes import REPO

pytestmark = pytest.mark.journal
# How long one `pipeline records …` may take: it starts Python and reads the journal.
CLI_TIMEOUT_S = 30


def set_error(rt, record_id: str, error: str, attempts: int) -> None:
    with rt.engine.begin() as conn:
        conn.execute(
            update(records)
            .where(records.c.id == record_id)
            .values(last_error=error, attempts=attempts)
        )


def pipeline(harness, *args: str) -> subprocess.CompletedProcess[str]:
    env = harness.env | {"COLUMNS": "250", "PIPELINE_LOG_LEVEL": "WARNING"}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def test_the_error_words_are_plain_text_so_percent_and_underscore_match_only_themselves(harness):
    rt = harness.runtime()
    ids = journal_records(
        rt, [{"business_no": f"E-{n}"} for n in range(5)], line="order", status=RecordStatus.FAILED
    )
    errors = ["50% off_x: refused", "50X offYx: refused", "50% offYx", "timeout", "TIMEOUT"]
    for n, (rid, error) in enumerate(zip(ids, errors, strict=True)):
        set_error(rt, rid, error, attempts=n + 1)
    client = harness.start_intake()

    def found(**query) -> set[str]:
        answer = client.get("/v1/records", params=query)
        assert answer.status_code == 200, answer.text
        return {item["id"] for item in answer.json()["items"]}

    assert found(error="50% off_") == {ids[0]}
    assert found(error="50") == set(ids[:3])
    assert found(error="timeout") == {ids[3], ids[4]}  # in any case, on every database
    assert found(error="refused") == {ids[0], ids[1]}  # anywhere in the error
    assert found(min_attempts=2, max_attempts=4) == set(ids[1:4])
    assert found(error="50", min_attempts=3) == {ids[2]}


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({"min_attempts": 3, "max_attempts": 2}, "min_attempts"),
        ({"min_attempts": -1}, "min_attempts"),
        ({"error": ""}, "error"),
        ({"error": "x" * 501}, "error"),
        ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "since"),
        ({"status": "lost"}, "status"),
    ],
)
def test_a_bad_filter_is_a_422_naming_it(harness, query, says):
    client = harness.start_intake()
    answer = client.get("/v1/records", params=query)
    assert answer.status_code == 422
    assert says in answer.json()["error"]["message"]


def test_records_list_pages_with_the_cursor_it_prints(harness):
    rt = harness.runtime()
    ids = sorted(
        journal_records(
            rt,
            [{"business_no": f"L-{n}"} for n in range(5)],
            line="order",
            status=RecordStatus.DEAD,
        )
    )
    journal_records(rt, [{"business_no": "L-done"}], line="order", status=RecordStatus.DONE)
    seen: list[str] = []
    after: list[str] = []
    for _page in range(3):
        run = pipeline(
            harness, "records", "list", "--dead", "--line", "order", "--limit", "2", *after
        )
        assert run.returncode == 0, run.stderr
        seen += [rid for rid in ids if rid in run.stdout]
        cursor = re.search(r"^next: (\S+)", run.stdout, re.MULTILINE)
        assert cursor is not None, run.stdout
        after = ["--after", cursor.group(1)]
    assert seen == ids
    assert "next: none" in run.stdout
    assert "L-done" not in run.stdout


def test_records_cancel_and_retry_on_the_command_line_audit_as_the_cli_user(harness):
    rt = harness.runtime()
    waiting, dead = journal_records(
        rt,
        [{"business_no": "C-1"}, {"business_no": "C-2"}],
        line="order",
        status=RecordStatus.FAILED,
    )
    with rt.engine.begin() as conn:
        conn.execute(update(records).where(records.c.id == dead).values(status="dead"))

    dry = pipeline(harness, "records", "retry", "--dead", "--line", "order", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "dry run: nothing was changed" in dry.stdout
    assert "would be retried" in dry.stdout
    cancel = pipeline(harness, "records", "cancel", waiting, "--reason", "duplicate order")
    assert cancel.returncode == 0, cancel.stderr
    again = pipeline(harness, "records", "cancel", waiting, "--reason", "again")
    assert again.returncode == 1
    assert "cancelled" in again.stderr
    retry = pipeline(harness, "records", "retry", "--dead", "--line", "order")
    assert retry.returncode == 0, retry.stderr

    statuses = {r.id: r.status for r in harness.records()}
    assert statuses == {waiting: RecordStatus.CANCELLED, dead: RecordStatus.ENQUEUED}
    with rt.journal.reading() as conn:
        rows = audit.newest(conn, limit=10)
    assert [(r.action, r.target) for r in rows] == [
        (audit.Action.RETRY, "line:order"),
        (audit.Action.CANCEL, f"record:{waiting}"),
    ]
    assert {r.actor for r in rows} == {f"cli:{getpass.getuser()}"}
    assert rows[1].reason == "duplicate order"
