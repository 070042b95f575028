"""Operator actions leave audit rows naming their actor: a replay from the API (the admin
token's name) or the CLI (`cli:<user>`), schedule changes; a dry run leaves none and
raises no alert. The log is read newest first by pages, from the API and the CLI, and
retention leaves it alone."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from app.clock import utcnow
from app.journal import audit
from app.journal.audit import Action
from app.journal.models import RecordStatus
from tests.support.journal import journal_records
from tests.support.processes import wait_for
from tests.support.recorder import Recorder

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal

REPO = Path(__file__).resolve().parents[2]
KEY_ID, SECRET = "shop-1", "s3cret-value-of-shop-1"
ALICE = "alice-token-0123456789"
ALICE_AUTH = {"authorization": f"Bearer {ALICE}"}
CLI_ACTOR = f"cli:{getpass.getuser()}"


@pytest.fixture
def webhook(harness):
    recorder = Recorder().start()
    harness.configure(
        intake_keys=json.dumps({KEY_ID: SECRET}),
        admin_tokens=json.dumps({"alice": ALICE}),
        alert_webhooks=json.dumps([{"kind": "generic", "url": f"{recorder.url}/hook"}]),
    )
    try:
        yield recorder
    finally:
        recorder.stop()


def pipeline(harness, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        env=harness.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def audit_rows(harness) -> list[audit.AuditEntry]:
    rt = harness.runtimes[0] if harness.runtimes else harness.runtime()
    with rt.journal.reading() as conn:
        return audit.newest(conn, limit=100)


def replay_alerts(recorder: Recorder) -> list:
    return [r for r in recorder.snapshot() if r.body.get("event") == "REPLAY_FINISHED"]


def test_a_replay_from_the_api_is_audited_as_its_token_and_a_dry_run_is_neither_audited_nor_alerted(
    harness, webhook
):
    rt = harness.runtime()
    journal_records(
        rt, [{"business_no": f"D-{n}"} for n in range(2)], line="order", status=RecordStatus.DEAD
    )
    client = harness.start_intake()
    body = {"line": "order", "statuses": ["dead"]}

    dry = client.post("/v1/replay", json=body | {"dry_run": True}, headers=ALICE_AUTH)
    assert dry.status_code == 200, dry.text
    assert (dry.json()["matched"], dry.json()["dry_run"]) == (2, True)
    assert audit_rows(harness) == []

    # The real run's alert is the first of its window: had the dry run raised one, the
    # real run's would be folded into it and this first message would be the dry run's.
    real = client.post("/v1/replay", json=body, headers=ALICE_AUTH)
    assert real.status_code == 200, real.text
    wait_for(lambda: replay_alerts(webhook), timeout_s=10, what="the REPLAY_FINISHED alert")
    (alert,) = replay_alerts(webhook)
    assert alert.body["details"]["dry_run"] is False

    (row,) = audit_rows(harness)
    assert (row.actor, row.action, row.target) == ("alice", Action.REPLAY, "line:order")
    assert row.params["statuses"] == ["dead"]
    assert row.result is not None
    assert (row.result["matched"], row.result["enqueued"]) == (2, 2)
    (replay,) = harness.rows("SELECT actor, dry_run FROM replays WHERE dry_run = false")
    assert replay.actor == "alice"
