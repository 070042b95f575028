"""A line's circuit breaker: a downstream down for a minute spends no record's attempts.
Records wait as `failed`, one probe goes at a time, `DOWNSTREAM_DOWN` is raised, and the
line resumes when a probe succeeds; no record dies of the outage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.support.downstream import Gauged
from tests.support.processes import wait_for
from tests.support.recorder import Recorder

pytestmark = [pytest.mark.journal_independent, pytest.mark.long]

OUTAGE_S = 60
PROBE_INTERVAL_S = 5


def _alerts(recorder: Recorder, event: str) -> list[dict[str, Any]]:
    return [r.body for r in recorder.snapshot() if r.body and r.body.get("event") == event]


def _circuit(client, line: str) -> dict[str, Any]:
    lines = client.get("/v1/lines").json()["lines"]
    (found,) = [row for row in lines if row["line"] == line]
    return found["circuit"]


def _waiting(client) -> set[str | None]:
    """What the line's failed records wait for, as the API shows them."""
    page = client.get("/v1/records", params={"line": "shipment", "status": "failed"}).json()
    return {item["waiting_for"] for item in page["items"]}


def test_a_downstream_down_for_a_minute_kills_no_record(harness):
    downstream = Gauged().start()
    downstream.status = 503
    hooks = Recorder().start()
    try:
        harness.configure(
            lines__shipment__downstream_url=f"{downstream.url}/in",
            lines__shipment__max_attempts="3",
            lines__shipment__backoff_initial_s="0.2",
            lines__shipment__backoff_max_s="1",
            lines__shipment__circuit_probe_interval_s=str(PROBE_INTERVAL_S),
            sweep_interval_seconds="1",
            alert_webhooks=json.dumps([{"kind": "generic", "url": f"{hooks.url}/hook"}]),
        )
        client = harness.start_intake()
        harness.start_worker("shipment", pool=None, concurrency=None)
        harness.start_beat()
        down_since = time.monotonic()
        ids = set()
        for n in range(40):
            response = client.post("/v1/shipment", json={"business_no": f"DOWN-{n}"})
            assert response.status_code == 202, response.text
            ids.add(response.json()["id"])

        wait_for(lambda: _alerts(hooks, "DOWNSTREAM_DOWN"), timeout_s=30, what="DOWNSTREAM_DOWN")
        alert = _alerts(hooks, "DOWNSTREAM_DOWN")[0]
        assert alert["line"] == "shipment"
        assert alert["details"]["failed"] * 2 > alert["details"]["counted"] >= 10
        opened_at = time.time()
        circuit = _circuit(client, "shipment")
        assert circuit["state"] == "open"
        assert circuit["opened_at"]
        assert circuit["next_probe_at"]
        metrics = client.get("/metrics").text
        assert 'pipeline_circuit_open{line="shipment"} 1.0' in metrics
        # A record waiting behind the open circuit shows as waiting for its downstream, in
        # the API and on the command line, not as a failure of its own.
        wait_for(
            lambda: _waiting(client) == {"downstream"},
            timeout_s=15,
            what="the failed records to wait for their downstream",
        )
        listed = subprocess.run(
            [sys.executable, "-m", "app.cli", "records", "list", "--line", "shipment"],
            env={**os.environ, **harness.env, "COLUMNS": "250"},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert "failed, waiting for downstream" in listed.stdout

        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_since)))
        downstream.status = 200
        recovered_at = time.time()
        final = harness.wait_until_final(ids, timeout_s=120)

        assert {record.status.value for record in final.values()} == {"done"}
        assert not _alerts(hooks, "TASK_DEAD")
        # While it was open, the downstream got one probe at a time, one every interval
        # (and what was in flight when it opened).
        settled = opened_at + 2
        probes = [at for at, _attempt in downstream.arrivals if settled <= at <= recovered_at]
        assert len(probes) <= (recovered_at - settled) / PROBE_INTERVAL_S + 2
        wait_for(
            lambda: _circuit(client, "shipment")["state"] == "closed",
            timeout_s=10,
            what="the circuit to close",
        )
        assert 'pipeline_circuit_open{line="shipment"} 0.0' in client.get("/metrics").text
        # Each record delivered once, under its Idempotency-Key.
        delivered = [r for r in downstream.snapshot() if r.answered == 200]
        assert sorted(r.headers["Idempotency-Key"] for r in delivered) == sorted(ids)
    finally:
        downstream.stop()
        hooks.stop()
