"""A record the intake runs itself under `caller_runs` is delivered like a worker's: through
its line's circuit and global limits. Before, the intake posted it past both: a full queue
sent deliveries to a downstream the circuit had given up on, spent their attempts there,
and went over `DELIVERY_CONCURRENCY`."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.support.downstream import Gauged
from tests.support.processes import wait_for
from tests.support.recorder import Recorder

pytestmark = pytest.mark.journal_independent


def _caller_runs(harness, downstream: Gauged, **settings: str) -> Any:
    """An intake whose shipment line posts to `downstream`, its queue full (one record
    waiting, bound 1, no worker): the intake runs each new record itself."""
    harness.configure(
        lines__shipment__downstream_url=f"{downstream.url}/in",
        lines__shipment__overflow="caller_runs",
        lines__shipment__max_queue_length="1",
        **settings,
    )
    client = harness.start_intake()
    queued = client.post("/v1/shipment", json={"business_no": "QUEUED"})
    assert queued.json()["status"] == "enqueued", queued.text
    return client


def test_caller_run_records_spend_no_attempt_once_the_circuit_is_open(harness):
    downstream = Gauged().start()
    downstream.status = 503
    hooks = Recorder().start()
    try:
        client = _caller_runs(
            harness,
            downstream,
            lines__shipment__max_attempts="3",
            lines__shipment__circuit_min_attempts="3",
            lines__shipment__circuit_probe_interval_s="600",
            alert_webhooks=json.dumps([{"kind": "generic", "url": f"{hooks.url}/hook"}]),
        )
        answers = []
        for n in range(6):
            response = client.post("/v1/shipment", json={"business_no": f"CALLER-{n}"})
            assert response.status_code == 202, response.text
            answers.append(response.json())

        # Three attempts failed and opened the circuit (the third, which opened it, got its
        # attempt back); the three records after them were not sent, and kept theirs.
        assert len(downstream.arrivals) == 3
        assert [answer["status"] for answer in answers] == ["failed"] * 6
        records = {record.id: record for record in harness.records()}
        assert [records[answer["id"]].attempts for answer in answers] == [1, 1, 0, 0, 0, 0]
        assert "dead" not in {record.status.value for record in records.values()}
        wait_for(
            lambda: any(
                r.body and r.body.get("event") == "DOWNSTREAM_DOWN" for r in hooks.snapshot()
            ),
            timeout_s=30,
            what="DOWNSTREAM_DOWN",
        )
        (line,) = [
            row for row in client.get("/v1/lines").json()["lines"] if row["line"] == "shipment"
        ]
        assert line["circuit"]["state"] == "open"
    finally:
        downstream.stop()
        hooks.stop()


def test_caller_run_records_keep_to_the_lines_concurrency_limit(harness):
    downstream = Gauged(delay_s=0.3).start()
    try:
        client = _caller_runs(harness, downstream, lines__shipment__delivery_concurrency="1")

        def post(n: int) -> int:
            response = client.post("/v1/shipment", json={"business_no": f"CALLER-{n}"})
            return int(response.status_code)

        # The intake runs up to the line's `concurrency` (4) records at once; the limit
        # lets one delivery at a time reach the downstream.
        with ThreadPoolExecutor(max_workers=8) as posts:
            statuses = list(posts.map(post, range(8)))
        assert set(statuses) <= {200, 202}, statuses
        assert statuses.count(200) >= 1  # delivered while its caller waited
        assert len(downstream.arrivals) >= 4
        assert downstream.most_in_flight == 1
    finally:
        downstream.stop()
