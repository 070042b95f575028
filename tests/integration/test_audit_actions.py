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
from sqlalchemy import update

from app.clock import utcnow
from app.errors import BrokerUnavailable
from app.journal import audit
from app.journal.audit import Action
from app.journal.models import RecordStatus, records
from app.recovery.replay import ReplayFilter
from tests.support.journal import journal_records
from tests.support.processes import free_port, wait_for
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


def test_a_replay_from_the_cli_is_audited_as_the_user_with_its_reason(harness):
    rt = harness.runtime()
    journal_records(rt, [{"business_no": "C-1"}], line="order", status=RecordStatus.DEAD)
    pipeline(harness, "replay", "--status", "dead", "--dry-run")
    assert audit_rows(harness) == []
    pipeline(harness, "replay", "--line", "order", "--status", "dead", "--reason", "fixed")
    (row,) = audit_rows(harness)
    assert (row.actor, row.action, row.target, row.reason) == (
        CLI_ACTOR,
        Action.REPLAY,
        "line:order",
        "fixed",
    )
    assert row.result is not None
    assert row.result["enqueued"] == 1


def test_schedule_changes_are_audited_and_pipeline_audit_pages_them_newest_first(harness):
    schedules = ("schedules", "add", "tick", "--cron", "*/5 * * * *", "--line", "order")
    pipeline(harness, *schedules)
    pipeline(harness, *schedules, "--replace", "--timezone", "Europe/Berlin")
    for change in ("disable", "enable", "remove"):
        pipeline(harness, "schedules", change, "tick")
    # A change that fails changes nothing and leaves no row.
    assert subprocess.run(
        [sys.executable, "-m", "app.cli", "schedules", "remove", "tick"],
        env=harness.env,
        cwd=REPO,
        capture_output=True,
        check=False,
    ).returncode

    rows = audit_rows(harness)
    assert [(r.action, r.target, r.actor) for r in rows] == [
        (action, "schedule:tick", CLI_ACTOR)
        for action in (
            Action.SCHEDULE_REMOVE,
            Action.SCHEDULE_ENABLE,
            Action.SCHEDULE_DISABLE,
            Action.SCHEDULE_ADD,
            Action.SCHEDULE_ADD,
        )
    ]
    assert (rows[3].params["timezone"], rows[3].result) == ("Europe/Berlin", {"changed": 1})
    assert (rows[4].params["replace"], rows[4].result) == (False, {"added": 1})

    harness.env["COLUMNS"] = "200"  # rich's table width: no cell wrapped or cut
    first = pipeline(harness, "audit", "--limit", "3")
    assert Action.SCHEDULE_REMOVE.value in first
    assert Action.SCHEDULE_DISABLE.value in first
    assert CLI_ACTOR in first
    assert f"pipeline audit --after {rows[2].id}" in first
    second = pipeline(harness, "audit", "--after", rows[2].id)
    assert "Europe/Berlin" in second
    assert Action.SCHEDULE_REMOVE.value not in second
    assert "no older entries" in second


def test_get_audit_pages_newest_first_for_an_admin_and_refuses_a_bad_page(harness, webhook):
    rt = harness.runtime()
    start = utcnow()
    with rt.journal.transaction() as conn:
        for n in range(3):
            audit.write(
                conn,
                actor="alice",
                action=Action.PAUSE,
                target=f"line:l{n}",
                params={},
                result=None,
                reason=f"r{n}",
                now=start + timedelta(seconds=n),
            )
    client = harness.start_intake()
    assert client.get("/v1/audit").status_code == 401

    first = client.get("/v1/audit", params={"limit": 2}, headers=ALICE_AUTH).json()
    assert [i["target"] for i in first["items"]] == ["line:l2", "line:l1"]
    assert first["items"][0] == {
        "id": first["items"][0]["id"],
        "time": (start + timedelta(seconds=2)).isoformat(),
        "actor": "alice",
        "action": "pause",
        "target": "line:l2",
        "params": {},
        "result": None,
        "reason": "r2",
    }
    second = client.get("/v1/audit", params={"after": first["next"]}, headers=ALICE_AUTH).json()
    assert ([i["target"] for i in second["items"]], second["next"]) == (["line:l0"], None)

    for params, where in (({"limit": 0}, "limit"), ({"after": "nope"}, "cursor")):
        bad = client.get("/v1/audit", params=params, headers=ALICE_AUTH)
        assert bad.status_code == 422
        assert bad.json()["error"]["code"] == "invalid_request"
        assert where in bad.json()["error"]["message"]


def test_retention_deletes_expired_records_and_leaves_the_audit_log(harness):
    harness.configure(retention_days="1")
    rt = harness.runtime()
    (old,) = journal_records(rt, [{"business_no": "OLD"}], line="order", status=RecordStatus.DONE)
    long_ago = utcnow() - timedelta(days=30)
    with rt.journal.transaction() as conn:
        conn.execute(update(records).values(created_at=long_ago, finished_at=long_ago))
        audit.write(
            conn,
            actor="alice",
            action=Action.RETRY,
            target=f"record:{old}",
            params={},
            result={"retried": 1},
            reason=None,
            now=long_ago,
        )
    assert rt.retention.purge(now=utcnow()) == 1
    assert harness.record_count() == 0
    assert [row.target for row in audit_rows(harness)] == [f"record:{old}"]


def test_a_replay_that_fails_part_way_is_audited_with_the_failure(harness):
    harness.configure(redis_url=f"redis://127.0.0.1:{free_port()}/0")  # nothing listens
    rt = harness.runtime()
    journal_records(rt, [{"business_no": "F-1"}], line="order", status=RecordStatus.DEAD)
    with pytest.raises(BrokerUnavailable):
        rt.replayer.replay(
            ReplayFilter(line="order"), dry_run=False, actor="alice", clock=utcnow, reason="x"
        )
    (row,) = audit_rows(harness)
    assert (row.actor, row.reason) == ("alice", "x")
    assert row.result is not None
    assert (row.result["matched"], row.result["error"]) == (1, "BrokerUnavailable")
