"""An intake per group of lines (PIPELINE_INTAKE_LINES) and a lower CPU priority for a
bulk line's processes (PIPELINE_NICE): a flood of one line kept off another's CPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.processes import wait_for

pytestmark = pytest.mark.journal_independent


def test_an_intake_refuses_a_line_it_does_not_take_and_journals_nothing_of_it(harness):
    harness.configure(intake_lines="order,refund")
    client = harness.start_intake()
    refused = client.post(
        "/v1/status",
        json={"business_no": "S-1", "status": "paid", "occurred_at": "2026-12-01T10:00:00Z"},
    )
    assert refused.status_code == 421
    body = refused.json()
    assert body["error"]["code"] == "line_not_served_here"
    assert "order, refund" in body["error"]["message"]
    assert harness.record_count() == 0
    taken = client.post("/v1/refund", json={"business_no": "R-1"})
    assert taken.status_code == 202, taken.text
    assert harness.record_count() == 1


def _nice_of(pid: int) -> int:
    # /proc/<pid>/stat: the 19th field is the nice value (after the command in parentheses).
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])


def test_a_worker_and_an_intake_started_with_pipeline_nice_run_at_that_priority(harness):
    harness.configure(nice="15")
    worker = harness.start_worker("status")
    intake = harness.run("intake", "--port", "0")
    intake.wait_for_output("cpu_priority_lowered", timeout_s=40)
    assert _nice_of(worker.pid) == 15
    assert _nice_of(intake.pid) == 15
    assert os.nice(0) == 0  # the test's own process is left as it was
    wait_for(lambda: "cpu_priority_lowered" in worker.output(), timeout_s=10, what="its log")
