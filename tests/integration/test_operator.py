"""The operator's view on a real stack: Flower behind basic auth lists a worker per line,
and `/metrics` agrees with what the test put in Redis and the journal.

The stack (a worker per line, beat, Flower, the intake, and the traffic below) is started
once for the module: each test reads it, none changes it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis

from tests.support.harness import Harness, signed_headers
from tests.support.metrics import Samples, metric, samples
from tests.support.processes import Component, free_port, wait_for

KEY_ID, SECRET = "shop-1", "shop-secret-of-16-bytes"
FLOWER_USER, FLOWER_PASSWORD = "ops", "flower-pw-1"
LINES = ("order", "refund", "status")


def post(client: httpx.Client, line: str, body: dict[str, object]) -> httpx.Response:
    raw = json.dumps(body).encode()
    return client.post(f"/v1/{line}", content=raw, headers=signed_headers(KEY_ID, SECRET, raw))


@dataclass
class Stack:
    harness: Harness
    client: httpx.Client
    flower: Component
    flower_url: str
    held_codes: list[int]  # the answers to the 7 posts to the line with no worker
    unsigned_code: int  # the answer to a post without a signature
    malformed_code: int  # the answer to a signed post whose body is not JSON


@pytest.fixture(scope="module")
def shared_stack(module_harness: Harness) -> Stack:
    harness = module_harness
    flower_port = free_port()
    harness.configure(
        intake_keys=json.dumps({KEY_ID: SECRET}),
        admin_token="admin-token-of-the-operator",
        flower_basic_auth=f"{FLOWER_USER}:{FLOWER_PASSWORD}",
        flower_port=str(flower_port),
        # A fourth line with no worker: what is posted to it stays on its queue.
        lines__held__max_queue_length="40",
        monitor_interval_seconds="1",
    )
    harness.runtime()  # the tests read the journal through it
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
    unsigned = client.post("/v1/order", json={"business_no": "ORD-X"})
    malformed = b'{"business_no": '
    bad = client.post(
        "/v1/order", content=malformed, headers=signed_headers(KEY_ID, SECRET, malformed)
    )
    harness.wait_until_final(ids, timeout_s=60)
    return Stack(
        harness=harness,
        client=client,
        flower=flower,
        flower_url=f"http://127.0.0.1:{flower_port}",
        held_codes=[r.status_code for r in held],
        unsigned_code=unsigned.status_code,
        malformed_code=bad.status_code,
    )


@pytest.fixture
def stack(shared_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Stack:
    """The shared stack, with its settings in this test's environment as well."""
    for name, value in shared_stack.harness.env.items():
        monkeypatch.setenv(name, value)
    return shared_stack


def flower_workers(stack: Stack) -> dict[str, Any]:
    """Flower's workers, once it lists one of every line (with the credentials)."""
    workers: dict[str, Any] = {}

    def lists_every_line() -> bool:
        assert stack.flower.process is not None
        assert stack.flower.process.poll() is None, stack.flower.output()
        try:
            response = httpx.get(
                f"{stack.flower_url}/api/workers",
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

    wait_for(lists_every_line, timeout_s=60, what="Flower to list a worker per line")
    return workers


def journal_counts(harness: Harness) -> dict[tuple[str, str], int]:
    sql = "SELECT line, status, count(*) FROM records GROUP BY line, status"
    return {(line, status): n for line, status, n in harness.rows(sql)}


def flushed_metrics(stack: Stack) -> Samples:
    """`/metrics`, once every worker's counters and the monitor's alert have reached it."""
    found: Samples = {}

    def counters_flushed() -> bool:
        found.clear()
        found.update(samples(stack.client.get("/metrics").text))
        done = [found.get(("pipeline_records_done_total", (("line", ln),))) for ln in LINES]
        alerts = found.get(
            ("pipeline_alerts_total", (("event", "NO_CONSUMER"), ("line", "held"))), 0
        )
        return done == [5, 3, 2] and alerts >= 1

    wait_for(counters_flushed, timeout_s=60, what="the workers' counters to reach /metrics")
    return found


def test_the_intake_accepts_signed_posts_and_refuses_unsigned_or_malformed_ones(stack):
    assert stack.held_codes == [202] * 7
    assert stack.unsigned_code == 401
    assert stack.malformed_code == 400


def test_records_of_a_line_with_a_worker_end_done_and_without_one_stay_enqueued(stack):
    journal = journal_counts(stack.harness)
    assert journal[("order", "done")] == 5
    assert journal[("held", "enqueued")] == 7


def test_flower_lists_one_worker_per_line(stack):
    workers = flower_workers(stack)
    assert sorted(name.split("@")[0] for name in workers) == sorted(LINES), workers


def test_flower_refuses_a_request_without_the_credentials_or_with_a_wrong_password(stack):
    flower_workers(stack)  # Flower is up, and answers with the credentials
    assert httpx.get(f"{stack.flower_url}/api/workers", timeout=10).status_code == 401
    wrong = httpx.get(f"{stack.flower_url}/api/workers", auth=(FLOWER_USER, "guess"), timeout=10)
    assert wrong.status_code == 401


def test_metrics_carry_every_workers_counters_and_the_monitors_alerts(stack):
    found = flushed_metrics(stack)
    for line, done in zip(LINES, (5, 3, 2), strict=True):
        assert metric(found, "pipeline_records_done_total", line=line) == done
    event = {"event": "NO_CONSUMER", "line": "held"}
    assert metric(found, "pipeline_alerts_total", **event) >= 1
    assert metric(found, "pipeline_records_dead_total", line="order") == 0

    print("\n/metrics for the order line:")
    for line in stack.client.get("/metrics").text.splitlines():
        if 'line="order"' in line:
            print(line)


def test_metrics_queue_depths_match_redis(stack):
    with redis.Redis.from_url(stack.harness.env["PIPELINE_REDIS_URL"]) as r:
        depth = {line: r.llen(line) for line in (*LINES, "held")}
    found = flushed_metrics(stack)
    assert metric(found, "pipeline_queue_depth", line="held") == depth["held"] == 7
    assert metric(found, "pipeline_queue_depth", line="order") == depth["order"] == 0
    assert metric(found, "pipeline_queue_max_length", line="held", overflow="defer") == 40


def test_metrics_record_counts_match_the_journal(stack):
    journal = journal_counts(stack.harness)
    found = flushed_metrics(stack)
    for (line, status), count in journal.items():
        assert metric(found, "pipeline_records", line=line, status=status) == count
    assert metric(found, "pipeline_records", line="order", status="dead") == 0
    assert metric(found, "pipeline_records", line="held", status="done") == 0


def test_metrics_oldest_unfinished_age_is_positive_only_where_records_wait(stack):
    found = flushed_metrics(stack)
    assert metric(found, "pipeline_oldest_unfinished_age_seconds", line="held") > 0
    assert metric(found, "pipeline_oldest_unfinished_age_seconds", line="order") == 0


def test_metrics_count_the_live_workers_of_each_line(stack):
    found = flushed_metrics(stack)
    for line in LINES:
        assert metric(found, "pipeline_live_workers", line=line) == 1
    assert metric(found, "pipeline_live_workers", line="held") == 0


def test_metrics_count_intake_requests_by_line_and_outcome(stack):
    found = flushed_metrics(stack)
    intake = "pipeline_intake_requests_total"
    assert metric(found, intake, line="order", outcome="accepted") == 5
    assert metric(found, intake, line="held", outcome="accepted") == 7
    assert metric(found, intake, line="order", outcome="unauthorized") == 1
    assert metric(found, intake, line="order", outcome="invalid") == 1
    assert metric(found, intake, line="refund", outcome="rejected") == 0


def test_metrics_report_redis_and_the_journal_up(stack):
    found = flushed_metrics(stack)
    assert metric(found, "pipeline_redis_up") == 1
    assert metric(found, "pipeline_journal_up") == 1
