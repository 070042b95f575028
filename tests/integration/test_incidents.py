"""Condition alerts are incidents: one message when one opens, none while it lasts, one
`RESOLVED` when the monitor finds the condition gone; `/v1/alerts` shows each with its
state and how long it lasted. A real beat runs the monitor, a real worker ends the
condition, and the webhook is a recording HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx
import pytest
import redis

from app.clock import utcnow
from app.config.redis import make_redis
from app.config.settings import load_settings, redis_options
from app.local.embedded_redis import RedisServer
from app.observe.liveness import ConsumerReport, publish_heartbeat
from app.telemetry.alerts import Alerter
from app.telemetry.counters import Telemetry
from app.telemetry.events import Event
from app.telemetry.incidents import RECENT_RESOLVED, IncidentBook, new_incident
from tests.support.processes import free_port, wait_for
from tests.support.recorder import Recorder


@pytest.fixture
def hooks(harness) -> Iterator[Recorder]:
    recorder = Recorder().start()
    harness.configure(
        monitor_interval_seconds="1",
        # An incident resolves once its condition was quiet this long: short, for speed.
        alert_window_seconds="1",
        worker_heartbeat_ttl_seconds="3",
        alert_webhooks=json.dumps([{"kind": "generic", "url": f"{recorder.url}/hook"}]),
    )
    try:
        yield recorder
    finally:
        recorder.stop()


def _sent(recorder: Recorder, event: str, line: str | None = "order") -> list[dict[str, Any]]:
    return [
        r.body
        for r in recorder.snapshot()
        if r.body and r.body.get("event") == event and r.body.get("line") == line
    ]


def _resolved(recorder: Recorder, event: str, line: str | None = "order") -> list[dict[str, Any]]:
    return [b for b in _sent(recorder, "RESOLVED", line) if b["details"]["incident"] == event]


def _incident(client: httpx.Client, event: str, line: str = "order") -> dict[str, Any] | None:
    alerts = client.get("/v1/alerts", params={"limit": 50}).json()["alerts"]
    found = [a for a in alerts if a["event"] == event and a["line"] == line]
    return found[0] if found else None


def _count(client: httpx.Client, event: str) -> int:
    incident = _incident(client, event)
    return 0 if incident is None else int(incident["count"])


def test_no_consumer_opens_once_and_resolves_once_when_a_worker_comes(harness, hooks):
    client = harness.start_intake()
    harness.start_beat()
    for n in range(2):
        assert client.post("/v1/order", json={"business_no": f"NC-{n}"}).status_code == 202

    wait_for(lambda: _sent(hooks, "NO_CONSUMER"), timeout_s=30, what="NO_CONSUMER")
    # The monitor (every second) sees it again and again: the incident counts the runs,
    # and no second message goes out.
    wait_for(lambda: _count(client, "NO_CONSUMER") >= 4, timeout_s=30, what="4 monitor runs")
    (opened,) = _sent(hooks, "NO_CONSUMER")
    assert opened["details"]["waiting"] == 2
    incident = _incident(client, "NO_CONSUMER")
    assert incident is not None
    assert incident["state"] == "open"
    assert incident["resolved_at"] is None
    assert incident["duration_s"] > 0
    assert incident["id"] == opened["details"]["incident_id"]

    harness.start_worker("order")
    wait_for(lambda: _resolved(hooks, "NO_CONSUMER"), timeout_s=30, what="RESOLVED")
    (resolved,) = _resolved(hooks, "NO_CONSUMER")
    assert resolved["event"] == "RESOLVED"
    assert resolved["line"] == "order"
    assert resolved["details"]["incident_id"] == incident["id"]
    assert resolved["details"]["duration_s"] >= incident["duration_s"]
    assert "NO_CONSUMER" in resolved["message"]

    shown = _incident(client, "NO_CONSUMER")
    assert shown is not None
    assert shown["id"] == incident["id"]
    assert shown["state"] == "resolved"
    assert shown["resolved_at"] is not None
    assert shown["duration_s"] == resolved["details"]["duration_s"]
    # Proves an absence, so time must pass: two more runs of the 1 s monitor, and still
    # one message each way.
    runs = _count(client, "NO_CONSUMER")
    time.sleep(2.5)
    assert len(_sent(hooks, "NO_CONSUMER")) == 1
    assert len(_resolved(hooks, "NO_CONSUMER")) == 1
    assert _count(client, "NO_CONSUMER") == runs


def test_a_backlog_over_several_runs_sends_one_message_and_resolves_when_done(harness, hooks):
    harness.configure(backlog_after_seconds="1")
    client = harness.start_intake()
    harness.start_beat()
    assert client.post("/v1/order", json={"business_no": "BL-1"}).status_code == 202

    wait_for(lambda: _sent(hooks, "BACKLOG"), timeout_s=30, what="BACKLOG")
    wait_for(lambda: _count(client, "BACKLOG") >= 4, timeout_s=30, what="4 monitor runs")
    assert len(_sent(hooks, "BACKLOG")) == 1
    open_incident = _incident(client, "BACKLOG")
    assert open_incident is not None
    assert open_incident["state"] == "open"
    assert open_incident["figures"]["threshold_s"] == 1

    harness.start_worker("order")
    wait_for(lambda: _resolved(hooks, "BACKLOG"), timeout_s=30, what="BACKLOG resolved")
    assert len(_sent(hooks, "BACKLOG")) == 1
    (resolved,) = _resolved(hooks, "BACKLOG")
    assert resolved["details"]["raised"] >= 4
    shown = _incident(client, "BACKLOG")
    assert shown is not None
    assert shown["state"] == "resolved"


def test_redis_down_is_held_by_the_process_and_resolved_once_redis_is_back(tmp_path, monkeypatch):
    # The incident of Redis itself cannot be kept in Redis while it is away: the process
    # that raised it holds it, sends its message once, and stores it when Redis is back.
    recorder = Recorder().start()
    server = RedisServer(port=free_port(), workdir=tmp_path)
    server.start()
    monkeypatch.setenv("PIPELINE_REDIS_CONNECT_TIMEOUT_SECONDS", "0.5")
    settings = load_settings(
        monitor_interval_seconds=0.5,
        alert_window_seconds=0.2,
        alert_webhooks=[{"kind": "generic", "url": f"{recorder.url}/hook"}],
    )
    client = make_redis(server.url, redis_options(settings))
    telemetry = Telemetry(client, interval_s=3600)
    alerter = Alerter(settings, clock=utcnow, telemetry=telemetry)
    try:
        server.stop()
        for _ in range(3):
            alerter.raise_event(Event.BROKER_DOWN, line=None, message="Redis does not answer")
            assert alerter.flush(timeout_s=10)
        wait_for(lambda: _sent(recorder, "BROKER_DOWN", None), timeout_s=10, what="BROKER_DOWN")
        # Judged still true while Redis is away: nothing resolves.
        key = (Event.BROKER_DOWN, None)
        alerter.settle(judged=[key], present=[key])
        assert alerter.flush(timeout_s=10)

        server.start()
        time.sleep(0.3)  # past the half monitor interval an incident must be quiet for
        alerter.settle(judged=[key], present=[])
        assert alerter.flush(timeout_s=10)
        wait_for(lambda: _resolved(recorder, "BROKER_DOWN", None), timeout_s=10, what="RESOLVED")
        assert len(_sent(recorder, "BROKER_DOWN", None)) == 1
        (resolved,) = _resolved(recorder, "BROKER_DOWN", None)
        assert resolved["details"]["raised"] == 3
        (kept,) = IncidentBook(client).resolved()
        assert kept.event is Event.BROKER_DOWN
        assert kept.id == resolved["details"]["incident_id"]
        assert kept.resolved_at is not None
        assert IncidentBook(client).open_incidents() == []
    finally:
        alerter.close()
        telemetry.close()
        client.close()
        server.stop()
        recorder.stop()


def test_a_stall_raised_by_a_worker_stays_open_while_its_heartbeat_says_so(harness):
    # WORKER_STALLED is raised by the worker that found its consumer stalled; the monitor
    # keeps the incident open while a heartbeat of the line says stalled, and resolves it
    # at the first run that finds none.
    recorder = Recorder().start()
    try:
        harness.configure(
            monitor_interval_seconds="0.2",
            alert_window_seconds="0.2",
            alert_webhooks=json.dumps([{"kind": "generic", "url": f"{recorder.url}/hook"}]),
        )
        rt = harness.runtime()
        stalled = ConsumerReport(
            stalled=True, taken=0, consuming=True, held=0, slots=1, starved_s=60
        )
        publish_heartbeat(
            rt.redis, line="order", hostname="w1", pid=1, ttl_s=30, now=utcnow(), consumer=stalled
        )
        rt.alerts.raise_event(
            Event.WORKER_STALLED, line="order", message="w1 takes nothing", hostname="w1"
        )
        for _ in range(3):
            time.sleep(0.25)  # each run past the 0.2 s an incident must be quiet for
            rt.monitor.monitor(now=utcnow())
            assert rt.alerts.flush(timeout_s=10)
        wait_for(lambda: _sent(recorder, "WORKER_STALLED"), timeout_s=10, what="WORKER_STALLED")
        assert not _resolved(recorder, "WORKER_STALLED")
        (opened,) = _sent(recorder, "WORKER_STALLED")
        assert opened["details"]["hostname"] == "w1"  # the worker's figures, not the monitor's

        publish_heartbeat(rt.redis, line="order", hostname="w1", pid=1, ttl_s=30, now=utcnow())
        cleared_at = time.monotonic()

        def run_once() -> bool:
            rt.monitor.monitor(now=utcnow())
            assert rt.alerts.flush(timeout_s=10)
            return bool(_resolved(recorder, "WORKER_STALLED"))

        # It resolves once the condition was quiet for 0.2 s, at a run of the monitor.
        wait_for(run_once, timeout_s=10, what="RESOLVED")
        assert time.monotonic() - cleared_at >= 0.2
        assert len(_sent(recorder, "WORKER_STALLED")) == 1
    finally:
        recorder.stop()


def test_an_open_incident_is_listed_before_newer_resolved_ones(harness):
    # An open incident not raised since it opened (a circuit open for an hour) is still
    # listed, first, however many newer resolved incidents and events there are.
    rt = harness.runtime()
    book = IncidentBook(rt.redis)
    now = utcnow()
    book.touch(
        (Event.DOWNSTREAM_DOWN, "order"),
        count=1,
        message="the circuit of 'order' is open",
        details={"circuit": "open"},
        now=now - timedelta(hours=1),
    )
    for n in range(RECENT_RESOLVED):
        at = now - timedelta(minutes=30) + timedelta(seconds=n)
        gone = new_incident((Event.BACKLOG, "refund"), count=1, message="old", details={}, now=at)
        book.remember_resolved(replace(gone, resolved_at=at + timedelta(seconds=1)))
    for n in range(5):
        rt.alerts.raise_event(Event.TASK_DEAD, line=f"line-{n}", message=f"R{n} is dead")
    rt.alerts.close()
    rt.telemetry.flush()
    client = harness.start_intake()

    shown = client.get("/v1/alerts", params={"limit": 20}).json()["alerts"]
    assert len(shown) == 20
    assert (shown[0]["event"], shown[0]["state"]) == ("DOWNSTREAM_DOWN", "open")
    rest = [alert["time"] for alert in shown[1:]]
    assert rest == sorted(rest, reverse=True)
    assert shown[1]["state"] == "event"


def test_a_hovering_condition_stays_one_incident_until_quiet_for_the_window(harness):
    # A queue hovering at its bound is full at one monitor run and not at the next: it
    # stays one incident (one message), and resolves only once it was quiet for
    # `alert_window_seconds`.
    recorder = Recorder().start()
    try:
        harness.configure(
            monitor_interval_seconds="0.1",
            alert_window_seconds="1.5",
            alert_webhooks=json.dumps([{"kind": "generic", "url": f"{recorder.url}/hook"}]),
        )
        rt = harness.runtime()
        key = (Event.QUEUE_FULL, "order")
        ends = time.monotonic() + 3.0
        while time.monotonic() < ends:
            rt.alerts.raise_event(Event.QUEUE_FULL, line="order", message="full", depth=1)
            rt.alerts.settle(judged=[key], present=[key])
            time.sleep(0.3)
            rt.alerts.settle(judged=[key], present=[])
            time.sleep(0.3)
        last_present = time.monotonic() - 0.3
        assert rt.alerts.flush(timeout_s=10)
        assert len(_sent(recorder, "QUEUE_FULL")) == 1
        assert not _resolved(recorder, "QUEUE_FULL")

        def run_once() -> bool:
            rt.alerts.settle(judged=[key], present=[])
            assert rt.alerts.flush(timeout_s=10)
            return bool(_resolved(recorder, "QUEUE_FULL"))

        wait_for(run_once, timeout_s=10, what="RESOLVED")
        assert time.monotonic() - last_present >= 1.5
        assert len(_resolved(recorder, "QUEUE_FULL")) == 1
        assert len(_sent(recorder, "QUEUE_FULL")) == 1
    finally:
        recorder.stop()


def test_an_incident_held_while_redis_was_away_is_stored_once_it_is_back(tmp_path, monkeypatch):
    # A process (not the monitor) raised a condition while Redis was away and held it:
    # once Redis is back it stores it without waiting for another raise, so the monitor
    # can resolve it.
    recorder = Recorder().start()
    server = RedisServer(port=free_port(), workdir=tmp_path)
    server.start()
    monkeypatch.setenv("PIPELINE_REDIS_CONNECT_TIMEOUT_SECONDS", "0.5")
    settings = load_settings(
        monitor_interval_seconds=0.2,
        alert_webhooks=[{"kind": "generic", "url": f"{recorder.url}/hook"}],
    )
    client = make_redis(server.url, redis_options(settings))
    telemetry = Telemetry(client, interval_s=3600)
    alerter = Alerter(settings, clock=utcnow, telemetry=telemetry)
    try:
        server.stop()
        alerter.raise_event(Event.WORKER_STALLED, line="order", message="w1 takes nothing")
        assert alerter.flush(timeout_s=10)
        wait_for(lambda: _sent(recorder, "WORKER_STALLED"), timeout_s=10, what="the message")

        server.start()

        def stored() -> bool:
            try:
                found = IncidentBook(client).open_incidents()
            except redis.RedisError:
                return False
            return [incident.key for incident in found] == [(Event.WORKER_STALLED, "order")]

        wait_for(stored, timeout_s=10, what="the held incident stored")
        assert len(_sent(recorder, "WORKER_STALLED")) == 1
    finally:
        alerter.close()
        telemetry.close()
        client.close()
        server.stop()
        recorder.stop()
