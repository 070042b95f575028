"""Flower's Broker tab shows each line's queue depth (the messages waiting on its Redis
list), from the queues the pipeline declares, with or without a worker."""

from __future__ import annotations

import re

import httpx

from tests.support.processes import TLS_CONTEXT, free_port, wait_for

FLOWER_USER, FLOWER_PASSWORD = "ops", "flower-pw-3"


def test_flowers_broker_tab_shows_the_messages_waiting_on_each_line(harness):
    flower_port = free_port()
    harness.configure(
        flower_basic_auth=f"{FLOWER_USER}:{FLOWER_PASSWORD}", flower_port=str(flower_port)
    )
    client = harness.start_intake()
    for n in range(3):  # one at a time: each its own message; no worker takes them
        answer = client.post("/v1/order", json={"business_no": f"FB-{n}"})
        assert answer.json()["status"] == "enqueued"
    flower = harness.run("flower")
    flower_url = f"http://127.0.0.1:{flower_port}"
    auth = (FLOWER_USER, FLOWER_PASSWORD)
    lengths: dict[str, int] = {}

    def queue_lengths() -> bool:
        assert flower.process is not None
        assert flower.process.poll() is None, flower.output()
        try:
            answer = httpx.get(
                f"{flower_url}/api/queues/length", auth=auth, timeout=5, verify=TLS_CONTEXT
            )
        except httpx.HTTPError:
            return False
        if answer.status_code != 200:
            return False
        lengths.update({q["name"]: q["messages"] for q in answer.json()["active_queues"]})
        return bool(lengths)

    wait_for(queue_lengths, timeout_s=60, what="Flower to answer /api/queues/length")
    # Beside Celery's default queue, which no pipeline task uses.
    assert {line: lengths.get(line) for line in ("order", "refund", "status")} == {
        "order": 3,
        "refund": 0,
        "status": 0,
    }
    page = httpx.get(f"{flower_url}/broker", auth=auth, timeout=10)
    assert page.status_code == 200
    # The page's row of the line: its name, then its messages.
    row = re.search(r'<tr id="order">\s*<td>order</td>\s*<td[^>]*>\s*(\d+)\s*</td>', page.text)
    assert row is not None, page.text
    assert row.group(1) == "3"
