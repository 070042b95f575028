"""Flower's own API tells the truth about a record that died: its task failed, with the
record's line and business number."""

from __future__ import annotations

from typing import Any

import httpx

from app.celery_app import create_celery
from app.journal.models import RecordStatus
from tests.support.processes import TLS_CONTEXT, free_port, wait_for

FLOWER_USER, FLOWER_PASSWORD = "ops", "flower-pw-2"


def test_flowers_api_reports_a_dead_records_task_as_failed(harness):
    flower_port = free_port()
    harness.configure(
        flower_basic_auth=f"{FLOWER_USER}:{FLOWER_PASSWORD}",
        flower_port=str(flower_port),
        lines__order__handler="tests.support.handlers:always_fail",
        lines__order__max_attempts="1",
    )
    flower_url = f"http://127.0.0.1:{flower_port}"
    auth = (FLOWER_USER, FLOWER_PASSWORD)
    harness.start_worker("order")
    flower = harness.run("flower")

    def lists_the_worker() -> bool:
        assert flower.process is not None
        assert flower.process.poll() is None, flower.output()
        try:
            answer = httpx.get(
                f"{flower_url}/api/workers", auth=auth, timeout=5, verify=TLS_CONTEXT
            )
        except httpx.HTTPError:
            return False
        return answer.status_code == 200 and any(n.startswith("order@") for n in answer.json())

    wait_for(lists_the_worker, timeout_s=60, what="Flower to list the order worker")
    # What Flower asks of the workers when it starts, asked again now that it listens: the
    # task's events must not be sent before it does.
    celery = create_celery(harness.settings())
    try:
        assert celery.control.enable_events(reply=True, timeout=10)
    finally:
        celery.close()
    client = harness.start_intake()
    record_id = client.post("/v1/order", json={"business_no": "ORD-DEAD-1"}).json()["id"]
    final = harness.wait_until_final({record_id}, timeout_s=30)[record_id]
    assert final.status is RecordStatus.DEAD

    task: dict[str, Any] = {}

    def flower_knows_it_failed() -> bool:
        answer = httpx.get(f"{flower_url}/api/task/info/{record_id}", auth=auth, timeout=5)
        if answer.status_code != 200:
            return False
        task.clear()
        task.update(answer.json())
        return task.get("state") == "FAILURE"

    wait_for(flower_knows_it_failed, timeout_s=30, what=f"Flower to report {record_id} failed")
    assert "dead" in str(task.get("exception"))
    assert "ORD-DEAD-1" in str(task.get("kwargs"))
    assert "order" in str(task.get("kwargs"))
