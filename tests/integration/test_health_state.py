"""`GET /v1/health` says at a glance whether the pipeline is in trouble: `state` ok,
degraded or down, and `reasons` naming each trouble and its line."""

from __future__ import annotations

import os
import signal
from typing import Any

import httpx

from app.clock import utcnow
from app.delivery.circuit import Health, Outcome
from app.local.embedded_redis import RedisServer
from app.observe.liveness import ConsumerReport, publish_heartbeat
from tests.support.circuits import CircuitsNow
from tests.support.processes import free_port, wait_for


def _health(client: httpx.Client) -> dict[str, Any]:
    response = client.get("/v1/health")
    assert response.status_code == 200
    return response.json()


def _codes(client: httpx.Client) -> set[tuple[str, str | None]]:
    return {(reason["code"], reason["line"]) for reason in _health(client)["reasons"]}


def _with_beat(harness: Any, client: httpx.Client) -> None:
    """Start a real beat and wait for its first sweep: without an active beat nothing
    sweeps, monitors or fires, and the page is degraded for it."""
    harness.start_beat()
    wait_for(
        lambda: not {code for code, _ in _codes(client)} & {"beat_down", "sweep_late"},
        timeout_s=30,
        what="the beat active and its first sweep done",
    )


def test_a_healthy_stack_is_ok_and_the_checks_stay(harness):
    client = harness.start_intake()
    _with_beat(harness, client)
    answer = _health(client)
    assert answer["state"] == "ok"
    assert answer["reasons"] == []
    # The strip's checks are answered as before.
    assert [check["name"] for check in answer["checks"]] == [
        "redis",
        "journal",
        "beat",
        "sweep",
        "schedules",
    ]
    assert isinstance(answer["ok"], bool)


def test_a_paused_line_makes_the_page_degraded_and_named(harness):
    client = harness.start_intake()
    _with_beat(harness, client)
    paused = client.post("/v1/lines/refund/pause", json={"reason": "maintenance"})
    assert paused.status_code == 200, paused.text
    # Each process sees the pauses at most a second late.
    wait_for(lambda: ("paused", "refund") in _codes(client), timeout_s=10, what="paused")
    answer = _health(client)
    assert answer["state"] == "degraded"
    (reason,) = [r for r in answer["reasons"] if r["code"] == "paused"]
    assert reason["line"] == "refund"
    assert "refund" in reason["message"]

    assert client.post("/v1/lines/refund/resume", json={}).status_code == 200
    wait_for(lambda: _health(client)["state"] == "ok", timeout_s=10, what="ok after the resume")


def test_an_open_circuit_makes_the_page_degraded_and_named(harness):
    # An HTTP-sink line; no worker ever calls its downstream here.
    harness.configure(lines__shipment__downstream_url=f"http://127.0.0.1:{free_port()}/in")
    rt = harness.runtime()
    line = rt.lines.get("shipment")
    outcomes = [Outcome(health=Health.DOWN)] * (line.settings.circuit_min_attempts + 1)
    counted = CircuitsNow(harness.settings().redis_url).count_all(
        "shipment", line.settings, outcomes
    )
    assert counted.state.value == "open"
    client = harness.start_intake()
    answer = _health(client)
    assert answer["state"] == "degraded"
    assert ("circuit_open", "shipment") in {(r["code"], r["line"]) for r in answer["reasons"]}


def test_a_line_with_work_and_no_worker_makes_the_page_degraded_and_named(harness):
    client = harness.start_intake()
    _with_beat(harness, client)
    assert _health(client)["state"] == "ok"  # no work, no worker: nothing wrong
    assert client.post("/v1/order", json={"business_no": "NW-1"}).status_code == 202
    # The lines' figures are at most a second old.
    wait_for(
        lambda: ("no_live_workers", "order") in _codes(client),
        timeout_s=10,
        what="no_live_workers on order",
    )
    answer = _health(client)
    assert answer["state"] == "degraded"
    assert {r["line"] for r in answer["reasons"] if r["code"] == "no_live_workers"} == {"order"}


def test_a_stalled_worker_makes_the_page_degraded_and_named(harness):
    rt = harness.runtime()
    stalled = ConsumerReport(stalled=True, taken=0, consuming=True, held=0, slots=1, starved_s=60)
    publish_heartbeat(
        rt.redis, line="refund", hostname="w1", pid=1, ttl_s=30, now=utcnow(), consumer=stalled
    )
    client = harness.start_intake()
    answer = _health(client)
    assert answer["state"] == "degraded"
    assert ("stalled_worker", "refund") in {(r["code"], r["line"]) for r in answer["reasons"]}


def test_a_backlog_past_the_alerts_threshold_makes_the_page_degraded(harness):
    harness.configure(backlog_after_seconds="1")
    client = harness.start_intake()
    assert client.post("/v1/refund", json={"business_no": "BL-1"}).status_code == 202
    wait_for(lambda: ("backlog", "refund") in _codes(client), timeout_s=10, what="backlog")
    assert _health(client)["state"] == "degraded"


def test_no_active_beat_makes_the_page_degraded_and_says_why(harness):
    # Nothing sweeps, monitors or fires without a beat: the page says so, not ok.
    client = harness.start_intake()
    answer = _health(client)
    assert answer["state"] == "degraded"
    reasons = {r["code"]: r for r in answer["reasons"]}
    assert {"beat_down", "sweep_late"} <= set(reasons), answer["reasons"]
    assert reasons["sweep_late"]["message"].startswith("no sweep has run")
    assert reasons["beat_down"]["line"] is None


def test_an_unreachable_redis_makes_the_page_down(harness):
    harness.configure(
        redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_connect_timeout_seconds="0.5"
    )
    client = harness.start_intake()
    answer = _health(client)
    assert answer["state"] == "down"
    (reason,) = answer["reasons"]
    assert (reason["code"], reason["line"]) == ("redis_down", None)
    assert reason["message"].startswith("Redis does not answer"), reason


def test_a_frozen_redis_makes_the_page_down_and_it_comes_back_ok(harness, tmp_path):
    server = RedisServer(port=free_port(), workdir=tmp_path)
    server.start()
    try:
        harness.configure(
            redis_url=server.url,
            redis_connect_timeout_seconds="0.5",
            redis_socket_timeout_seconds="1.5",
        )
        client = harness.start_intake()
        _with_beat(harness, client)
        assert _health(client)["state"] == "ok"
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            answer = _health(client)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert answer["state"] == "down"
        assert [r["code"] for r in answer["reasons"]] == ["redis_down"]
        wait_for(lambda: _health(client)["state"] == "ok", timeout_s=15, what="ok again")
    finally:
        server.stop()
