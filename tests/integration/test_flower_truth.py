"""Flower's own API tells the truth about a message that did not deliver: a record that
died, and records its line's open circuit postponed, show as a failed task, with the
record's line and business number and why."""

from __future__ import annotations

from typing import Any

import httpx

from app.celery_app import create_celery
from app.journal.models import RecordStatus
from tests.support.downstream import Gauged
from tests.support.harness import Harness
from tests.support.processes import TLS_CONTEXT, free_port, wait_for

FLOWER_USER, FLOWER_PASSWORD = "ops", "flower-pw-2"
AUTH = (FLOWER_USER, FLOWER_PASSWORD)


def _start_flower(harness: Harness, line: str) -> str:
    """Flower, listening and listing `line`'s worker (already started), with the workers
    sending task events; its URL. Set `flower_port` and `flower_basic_auth` first."""
    flower_url = f"http://127.0.0.1:{harness.env['PIPELINE_FLOWER_PORT']}"
    flower = harness.run("flower")

    def lists_the_worker() -> bool:
        assert flower.process is not None
        assert flower.process.poll() is None, flower.output()
        try:
            answer = httpx.get(
                f"{flower_url}/api/workers", auth=AUTH, timeout=5, verify=TLS_CONTEXT
            )
        except httpx.HTTPError:
            return False
        return answer.status_code == 200 and any(n.startswith(f"{line}@") for n in answer.json())

    wait_for(lists_the_worker, timeout_s=60, what=f"Flower to list the {line} worker")
    # What Flower asks of the workers when it starts, asked again now that it listens: the
    # task's events must not be sent before it does.
    celery = create_celery(harness.settings())
    try:
        assert celery.control.enable_events(reply=True, timeout=10)
    finally:
        celery.close()
    return flower_url


def _failed_task(flower_url: str, task_id: str) -> dict[str, Any]:
    """The task as Flower's API shows it, once Flower shows it failed."""
    task: dict[str, Any] = {}

    def flower_knows_it_failed() -> bool:
        answer = httpx.get(f"{flower_url}/api/task/info/{task_id}", auth=AUTH, timeout=5)
        if answer.status_code != 200:
            return False
        task.clear()
        task.update(answer.json())
        return task.get("state") == "FAILURE"

    wait_for(flower_knows_it_failed, timeout_s=30, what=f"Flower to report {task_id} failed")
    return task


def test_flowers_api_reports_a_dead_records_task_as_failed(harness):
    harness.configure(
        flower_basic_auth=f"{FLOWER_USER}:{FLOWER_PASSWORD}",
        flower_port=str(free_port()),
        lines__order__handler="tests.support.handlers:always_fail",
        lines__order__max_attempts="1",
    )
    harness.start_worker("order")
    flower_url = _start_flower(harness, "order")
    client = harness.start_intake()
    record_id = client.post("/v1/order", json={"business_no": "ORD-DEAD-1"}).json()["id"]
    final = harness.wait_until_final({record_id}, timeout_s=30)[record_id]
    assert final.status is RecordStatus.DEAD

    task = _failed_task(flower_url, record_id)
    assert "dead" in str(task.get("exception"))
    assert "ORD-DEAD-1" in str(task.get("kwargs"))
    assert "order" in str(task.get("kwargs"))


def test_flowers_api_reports_records_postponed_by_an_open_circuit_as_not_delivered(harness):
    downstream = Gauged().start()
    downstream.status = 503
    try:
        harness.configure(
            flower_basic_auth=f"{FLOWER_USER}:{FLOWER_PASSWORD}",
            flower_port=str(free_port()),
            lines__shipment__downstream_url=f"{downstream.url}/in",
            lines__shipment__circuit_min_attempts="2",
            # No probe while the test runs: every record after the circuit opened waits.
            lines__shipment__circuit_probe_interval_s="600",
            lines__shipment__backoff_initial_s="300",
        )
        harness.start_worker("shipment")
        flower_url = _start_flower(harness, "shipment")
        client = harness.start_intake()
        for n in range(2):
            response = client.post("/v1/shipment", json={"business_no": f"SHIP-DOWN-{n}"})
            assert response.status_code == 202, response.text

        def circuit_open() -> bool:
            lines = client.get("/v1/lines").json()["lines"]
            return any(r["line"] == "shipment" and r["circuit"]["state"] == "open" for r in lines)

        wait_for(circuit_open, timeout_s=30, what="the shipment line's circuit to open")
        arrived = len(downstream.arrivals)
        record_id = client.post("/v1/shipment", json={"business_no": "SHIP-WAIT-1"}).json()["id"]

        task = _failed_task(flower_url, record_id)
        shown = client.get(f"/v1/records/{record_id}").json()
    finally:
        downstream.stop()

    # The record spent no attempt and reached no downstream: it waits for its circuit.
    assert (shown["status"], shown["attempts"], shown["waiting_for"]) == ("failed", 0, "downstream")
    assert len(downstream.arrivals) == arrived
    exception = str(task.get("exception"))
    assert "postponed: 1, waiting for downstream" in exception
    assert f"shipment SHIP-WAIT-1 (record {record_id})" in exception
    assert "the circuit of shipment is open" in exception
    assert "SHIP-WAIT-1" in str(task.get("kwargs"))
