"""Nothing lost, proven: ≥ 2,000 records posted by concurrent clients while a fault happens,
then the ledger check (every accepted record done, delivered, one row per business_no)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from app.local.processes import kill_group
from tests.support.processes import wait_for
from tests.support.recorder import Recorder
from tests.support.services import require

# A scenario loads 1,050 to 2,100 records, injects its fault, then waits up to 180 s for the
# ledger.
# Each scenario loads the machine: under pytest -n N they run one after another.
pytestmark = [pytest.mark.timeout(420), pytest.mark.loads_machine]


def test_worker_killed_twice_mid_processing_loses_nothing(chaos):
    chaos.start()

    def fault() -> None:
        for _ in range(2):
            worker = chaos.workers["refund"]
            kill_group(worker.pid)
            worker.process.wait(timeout=10)
            # Part of the fault, not a wait: the line has no worker for a second while the
            # load goes on.
            time.sleep(1)
            restarted = chaos.start_worker("refund")
            # Killed again once it is at work, so that it too dies mid-processing.
            restarted.wait_for_output("record_done", timeout_s=60)
        kill_group(chaos.workers["order"].pid)
        chaos.workers["order"].process.wait(timeout=10)
        chaos.start_worker("order")

    chaos.load_with_fault(fault)
    # A killed worker's record is delivered again by the attempt that takes its lease over.
    chaos.check(repeats_allowed=True)


def test_intake_killed_mid_load_clients_retry_with_the_same_nonce(chaos):
    chaos.start()

    def fault() -> None:
        kill_group(chaos.intake.pid)
        chaos.intake.process.wait(timeout=10)
        retries = chaos.ledger.retries
        # Down until the clients have met the killed intake.
        wait_for(
            lambda: chaos.ledger.retries > retries,
            timeout_s=60,
            what="a client to retry against the killed intake",
        )
        chaos.start_intake()

    chaos.load_with_fault(fault)
    figures = chaos.check()
    assert figures["client_retries"] > 0


def test_redis_killed_and_restarted_empty_mid_load(chaos):
    chaos.start()

    def fault() -> None:
        chaos.redis.process.kill()
        chaos.redis.process.wait(timeout=10)
        # Part of the fault, not a wait: Redis stays down for two seconds of the load.
        time.sleep(2)
        chaos.redis.start()

    # A smaller load: what this fault tests needs records in flight, not a flood, and the
    # suite's time is mostly these loads.
    chaos.load_with_fault(fault, total=1200, after=300)
    chaos.check()


def test_flushall_mid_load(chaos):
    chaos.start()

    def fault() -> None:
        client = chaos.redis.client()
        try:
            client.flushall()
        finally:
            client.close()

    # A smaller load: what this fault tests needs records in flight, not a flood, and the
    # suite's time is mostly these loads.
    chaos.load_with_fault(fault, total=1200, after=300)
    chaos.check()


def postgres_restart_command() -> list[str] | None:
    versions = Path("/etc/postgresql")
    if shutil.which("pg_ctlcluster") is None or not versions.is_dir() or os.geteuid() != 0:
        return None
    version = sorted(p.name for p in versions.iterdir())[-1]
    return ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"]


@pytest.mark.journal
def test_database_restarted_mid_load(chaos):
    if chaos.harness.env["PIPELINE_DATABASE_URL"].startswith("sqlite"):
        pytest.skip(
            "the journal is SQLite, embedded in each process: there is no server to restart"
        )
    command = postgres_restart_command()
    require(command is not None, "cannot restart PostgreSQL here (needs root and pg_ctlcluster)")
    assert command is not None
    chaos.start()

    def fault() -> None:
        subprocess.run(command, check=True, timeout=120, capture_output=True)

    chaos.load_with_fault(fault)
    # A delivery whose outcome the journal could not take is delivered again later.
    chaos.check(repeats_allowed=True)


def test_downstream_failing_for_20_seconds_then_every_record_ends_done(chaos):
    chaos.recorder.status = 500
    chaos.start(
        lines__refund__max_attempts="40",
        lines__refund__backoff_initial_s="0.5",
        lines__refund__backoff_max_s="2",
    )
    started = time.monotonic()
    # A smaller load: what this fault tests needs records in flight, not a flood, and the
    # suite's time is mostly these loads.
    chaos.load(1050)  # the whole load lands while the downstream fails
    # Part of the scenario, not a wait: the downstream fails for 20 seconds in all.
    time.sleep(max(0.0, 20 - (time.monotonic() - started)))
    chaos.recorder.status = 200
    figures = chaos.check(timeout_s=240)
    refused = [r for r in chaos.recorder.snapshot() if r.answered == 500]
    assert refused, "the downstream never failed"
    attempts = [r.attempts for r in chaos.harness.records() if r.line == "refund"]
    assert max(attempts) > 1
    assert figures["lost"] == 0


def test_downstream_failing_with_few_attempts_ends_dead_then_replay_gets_all_done(chaos, tmp_path):
    alerts = Recorder().start()
    try:
        chaos.recorder.status = 500
        chaos.start(
            lines__refund__max_attempts="2",
            lines__refund__backoff_initial_s="0.2",
            lines__refund__backoff_max_s="0.5",
            # The circuit would keep these records waiting instead (its own test): here
            # the records must use up their attempts.
            lines__refund__circuit_min_attempts="1000000",
            alert_webhooks=json.dumps([{"kind": "generic", "url": f"{alerts.url}/alerts"}]),
        )
        # A smaller load: what this fault tests needs records in flight, not a flood, and the
        # suite's time is mostly these loads.
        chaos.load(1050)
        refunds = {a.record_id for a in chaos.ledger.accepted if a.line == "refund"}
        final = chaos.harness.wait_until_final(refunds, timeout_s=180)
        assert {r.status.value for r in final.values()} == {"dead"}
        wait_for(
            lambda: any(r.body["event"] == "TASK_DEAD" for r in alerts.snapshot()),
            timeout_s=30,
            what="TASK_DEAD",
        )
        dead_alerts = [r.body for r in alerts.snapshot() if r.body["event"] == "TASK_DEAD"]
        assert sum(a["count"] for a in dead_alerts) >= 1
        assert all(a["line"] == "refund" for a in dead_alerts)

        chaos.recorder.status = 200
        replay = chaos.harness.run("replay", "--status", "dead")
        replay.process.wait(timeout=180)
        assert replay.process.returncode == 0, replay.output()
        assert str(len(refunds)) in replay.output()
        chaos.check(timeout_s=180)
    finally:
        alerts.stop()
