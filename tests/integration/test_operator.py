"""The operator's view on a real stack: Flower behind basic auth lists a worker per line,
and `/metrics` agrees with what the test put in Redis and the journal."""

from __future__ import annotations

import json

import httpx
import redis

from tests.support.harness import signed_headers
from tests.support.metrics import metric, samples
from tests.support.processes import free_port, wait_for

KEY_ID, SECRET = "shop-1", "shop-secret"
FLOWER_USER, FLOWER_PASSWORD = "ops", "flower-pw-1"
LINES = ("order", "refund", "status")


def post(client: httpx.Client, line: str, body: dict[str, object]) -> httpx.Response:
    raw = json.dumps(body).encode()
    return client.post(f"/v1/{line}", content=raw, headers=signed_headers(KEY_ID, SECRET, raw))


def test_flower_lists_each_line_and_metrics_match_redis_and_journal(harness):
    flower_port = free_port()
    harness.configure(
        intake_keys=json.dumps({KEY_ID: SECRET}),
        admin_token="admin-token-1",
        flower_basic_auth=f"{FLOWER_USER}:{FLOWER_PASSWORD}",
        flower_port=str(flower_port),
        # A fourth line with no worker: what is posted to it stays on its queue.
        lines__held__max_queue_length="40",
        monitor_interval_seconds="1",
    )
    for line in LINES:
        harness.start_worker(line)
    harness.start_beat()
    flower = harness.run("flower")
    client = harness.start_intake()

    ids = set()
    for n in range(5):
        ids.add(post(client, "order", {"business_no": f"ORD-{n}"}).json()["id"])
    for n in range(3):
        ids.add(post(client, "refund", {"business_no": f"RF-{n}"}).json()["id"])
    for n in range(2):
        body = {"business_no": f"ORD-{n}", "status": "paid", "occurred_at": "2026-11-29T10:00:00Z"}
        ids.add(post(client, "status", body).json()["id"])
    held = [post(client, "held", {"business_no": f"H-{n}"}) for n in range(7)]
    assert [r.status_code for r in held] == [202] * 7
    unsigned = client.post("/v1/order", json={"business_no": "ORD-X"})
    assert unsigned.status_code == 401
    malformed = b'{"business_no": '
    bad = client.post(
        "/v1/order", content=malformed, headers=signed_headers(KEY_ID, SECRET, malformed)
    )
    assert bad.status_code == 400
    harness.wait_until_final(ids, timeout_s=60)

    # Flower: refuses without the credentials, lists a worker per line with them.
    base = f"http://127.0.0.1:{flower_port}"
    workers: dict[str, object] = {}

    def flower_lists_every_line() -> bool:
        assert flower.process is not None
        assert flower.process.poll() is None, flower.output()
        try:
            response = httpx.get(
                f"{base}/api/workers",
                params={"refresh": "1"},
                auth=(FLOWER_USER, FLOWER_PASSWORD),
                timeout=10,
            )
        except httpx.HTTPError:
            return False
        if response.status_code != 200:
            return False
        workers.clear()
        workers.update(response.json())
        return {name.split("@")[0] for name in workers} >= set(LINES)

    wait_for(flower_lists_every_line, timeout_s=60, what="Flower to list a worker per line")
    assert sorted(name.split("@")[0] for name in workers) == sorted(LINES), workers
    assert httpx.get(f"{base}/api/workers", timeout=10).status_code == 401
    wrong = httpx.get(f"{base}/api/workers", auth=(FLOWER_USER, "guess"), timeout=10)
    assert wrong.status_code == 401

    # /metrics: what Redis and the journal hold, and the counters of every process.
    with redis.Redis.from_url(harness.env["PIPELINE_REDIS_URL"]) as r:
        depth = {line: r.llen(line) for line in (*LINES, "held")}
    journal = {
        (line, status): n
        for line, status, n in harness.rows(
            "SELECT line, status, count(*) FROM records GROUP BY line, status"
        )
    }
    assert journal[("order", "done")] == 5
    assert journal[("held", "enqueued")] == 7
    found: dict = {}

    def counters_flushed() -> bool:
        found.clear()
        found.update(samples(client.get("/metrics").text))
        done = [found.get(("pipeline_records_done_total", (("line", ln),))) for ln in LINES]
        alerts = found.get(
            ("pipeline_alerts_total", (("event", "NO_CONSUMER"), ("line", "held"))), 0
        )
        return done == [5, 3, 2] and alerts >= 1

    wait_for(counters_flushed, timeout_s=30, what="the workers' counters to reach /metrics")
    assert metric(found, "pipeline_queue_depth", line="held") == depth["held"] == 7
    assert metric(found, "pipeline_queue_depth", line="order") == depth["order"] == 0
    assert metric(found, "pipeline_queue_max_length", line="held", overflow="defer") == 40
    for (line, status), count in journal.items():
        assert metric(found, "pipeline_records", line=line, status=status) == count
    assert metric(found, "pipeline_records", line="order", status="dead") == 0
    assert metric(found, "pipeline_records", line="held", status="done") == 0
    assert metric(found, "pipeline_oldest_unfinished_age_seconds", line="held") > 0
    assert metric(found, "pipeline_oldest_unfinished_age_seconds", line="order") == 0
    for line in LINES:
        assert metric(found, "pipeline_live_workers", line=line) == 1
    assert metric(found, "pipeline_live_workers", line="held") == 0
    intake = "pipeline_intake_requests_total"
    assert metric(found, intake, line="order", outcome="accepted") == 5
    assert metric(found, intake, line="held", outcome="accepted") == 7
    assert metric(found, intake, line="order", outcome="unauthorized") == 1
    assert metric(found, intake, line="order", outcome="invalid") == 1
    assert metric(found, intake, line="refund", outcome="rejected") == 0
    assert metric(found, "pipeline_records_dead_total", line="order") == 0
    assert metric(found, "pipeline_redis_up") == 1
    assert metric(found, "pipeline_journal_up") == 1

    print("\n/metrics for the order line:")
    for line in client.get("/metrics").text.splitlines():
        if 'line="order"' in line:
            print(line)
