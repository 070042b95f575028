"""No SQL is built from input: injection strings through every filter of the records list,
the bulk retry and cancel (dry runs), the replay endpoint and the schedules command find
nothing, change nothing and break nothing; and no statement in the code is built by string
formatting."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from tests.support.harness import signed_headers
from tests.support.processes import REPO

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal

KEY_ID, SECRET, ADMIN = "shop-1", "s3cret-of-16-bytes", "admin-token-of-injection"
PIPELINE = str(Path(sys.executable).with_name("pipeline"))
INJECTIONS = [
    "' OR '1'='1",
    "order' --",
    '"; DROP TABLE records; --',
    "1; DELETE FROM records",
    "%",
    "_",
    "' UNION SELECT id, payload FROM records --",
    "\\' OR 1=1 #",
    "a\x00' OR 1=1",  # PostgreSQL refuses NUL in text: refused before it gets there
]
SQL_CALLS = {"text", "execute", "exec_driver_sql", "executescript"}


@pytest.fixture
def intake(harness):
    harness.configure(intake_keys=json.dumps({KEY_ID: SECRET}), admin_token=ADMIN)
    client = harness.start_intake()
    for n in range(3):
        body = json.dumps({"business_no": f"ORD-{n}"}).encode()
        response = client.post(
            "/v1/order", content=body, headers=signed_headers(KEY_ID, SECRET, body)
        )
        assert response.status_code == 202
    return client


@pytest.mark.parametrize("evil", INJECTIONS)
def test_injection_strings_through_every_filter_find_and_change_nothing(harness, intake, evil):
    admin = {"authorization": f"Bearer {ADMIN}"}
    before = harness.record_count()
    ids = [record.id for record in harness.records()]
    for name in ("line", "business_no", "after", "status", "source", "since", "until", "error"):
        response = intake.get("/v1/records", params={name: evil}, headers=admin)
        assert response.status_code in (200, 422), (name, response.text)
        if response.status_code != 200:
            continue
        found = [item["id"] for item in response.json()["items"]]
        # `after` is a cursor: the ids that sort after the string, taken as a plain value.
        expected = sorted(i for i in ids if i > evil) if name == "after" else []
        assert found == expected, (name, found)
    path = "/v1/records/" + urllib.parse.quote(evil, safe="")
    assert intake.get(path, headers=admin).status_code in (404, 422)
    bulk = {"business_no": [evil], "error": evil, "reason": evil, "dry_run": True}
    for action in ("retry", "cancel"):
        answer = intake.post(f"/v1/records/{action}", json=bulk, headers=admin)
        assert answer.status_code in (200, 422), (action, answer.text)
        assert answer.status_code == 422 or answer.json()["matched"] == 0
    replay = intake.post(
        "/v1/replay",
        json={"business_nos": [evil], "dry_run": True},
        headers=admin,
    )
    if "\x00" in evil:
        assert replay.status_code == 422, replay.text
        assert harness.record_count() == before
        return  # a command line cannot carry a NUL
    assert replay.status_code == 200, replay.text
    assert replay.json()["matched"] == 0
    line = intake.post("/v1/replay", json={"line": evil, "dry_run": True}, headers=admin)
    assert line.status_code in (404, 422)  # unknown, or longer than a line name can be
    schedule = subprocess.run(
        [PIPELINE, "schedules", "remove", evil],
        env=harness.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert schedule.returncode != 0
    assert "Traceback" not in schedule.stderr
    assert harness.record_count() == before == 3


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_times_with_no_utc_equivalent_are_refused(intake, moment):
    admin = {"authorization": f"Bearer {ADMIN}"}
    for name in ("since", "until"):
        response = intake.get("/v1/records", params={name: moment}, headers=admin)
        assert response.status_code == 422, response.text
        replay = intake.post("/v1/replay", json={name: moment, "dry_run": True}, headers=admin)
        assert replay.status_code == 422, replay.text


def sql_built_from_strings(path: Path, *, root: Path = REPO) -> list[str]:
    """Calls that hand SQL to the database built with an f-string, `%` or `.format`, each
    named by its place relative to `root`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in SQL_CALLS:
            continue
        sql = node.args[0]
        formatted = (
            isinstance(sql, ast.JoinedStr)
            or (isinstance(sql, ast.BinOp) and isinstance(sql.op, ast.Mod | ast.Add))
            or (
                isinstance(sql, ast.Call)
                and isinstance(sql.func, ast.Attribute)
                and sql.func.attr == "format"
            )
        )
        if formatted:
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_statement_is_built_by_string_formatting():
    files = [p for d in ("app", "workers", "beat") for p in (REPO / d).rglob("*.py")]
    assert len(files) > 30
    assert [hit for path in files for hit in sql_built_from_strings(path)] == []


def test_the_checker_finds_a_formatted_statement(tmp_path):
    # The sample is written under tmp_path, laid out as it would be in the source tree.
    bad = tmp_path / "tests" / "support" / "_formatted_sql_sample.py"
    bad.parent.mkdir(parents=True)
    bad.write_text('def f(conn, x):\n    conn.execute(text(f"SELECT {x}"))\n')
    found = sql_built_from_strings(bad, root=tmp_path)
    assert found == ["tests/support/_formatted_sql_sample.py:2"]
