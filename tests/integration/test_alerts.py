"""Alerts reach a recording webhook on 127.0.0.1: a condition once per incident, point
events folded per window, signed, never blocking."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import multiprocessing
import time
from typing import Any

import pytest

from app.clock import utcnow
from app.config.redis import make_redis
from app.config.settings import load_settings, redis_options
from app.telemetry.alerts import FLUSH_INTERVAL_S, Alerter
from app.telemetry.counters import Telemetry
from app.telemetry.events import Event
from app.telemetry.incidents import IncidentBook
from tests.support.processes import wait_for
from tests.support.recorder import Recorder, SilentServer

# Long enough that a sender delayed by a busy machine (tests run two at a time) stays
# well inside the 20 % the gaps below allow.
WINDOW_S = 3.0
GENERIC_SECRET, DING_SECRET = "generic-secret", "SEC-ding-secret"


@pytest.fixture
def hooks(harness):
    recorder = Recorder().start()
    harness.configure(
        alert_window_seconds=str(WINDOW_S),
        alert_webhooks=json.dumps(
            [
                {"kind": "generic", "url": f"{recorder.url}/generic", "secret": GENERIC_SECRET},
                {
                    "kind": "dingtalk",
                    "url": f"{recorder.url}/ding?access_token=t",
                    "secret": DING_SECRET,
                },
                {"kind": "slack", "url": f"{recorder.url}/slack"},
            ]
        ),
    )
    try:
        yield recorder
    finally:
        recorder.stop()


def messages(recorder: Recorder, path: str, event: str) -> list:
    found = []
    for received in recorder.snapshot():
        if received.path != path:
            continue
        text = json.dumps(received.body)
        if event in text:
            found.append(received)
    return found


def test_a_queue_kept_full_is_one_queue_full_incident_counting_every_overflow(harness, hooks):
    harness.configure(lines__order__max_queue_length="1", lines__order__overflow="reject")
    client = harness.start_intake()
    assert client.post("/v1/order", json={"business_no": "FILL"}).status_code == 202
    overflows = 0
    started = time.monotonic()
    while time.monotonic() - started < WINDOW_S * 2:
        response = client.post("/v1/order", json={"business_no": f"X-{overflows}"})
        assert response.status_code == 429
        overflows += 1
        time.sleep(0.01)  # paces the posts that keep the queue full for two windows

    # A condition is an incident: one message when it opens, every later overflow only
    # counted on it (no beat runs here, so nothing resolves it).
    def all_counted() -> bool:
        alerts = client.get("/v1/alerts").json()["alerts"]
        found = [a for a in alerts if a["event"] == "QUEUE_FULL"]
        return bool(found) and found[0]["count"] == overflows

    wait_for(all_counted, timeout_s=10, what="every overflow counted on the incident")
    (incident,) = [
        a for a in client.get("/v1/alerts").json()["alerts"] if a["event"] == "QUEUE_FULL"
    ]
    assert incident["state"] == "open"
    assert incident["line"] == "order"
    assert incident["resolved_at"] is None
    assert incident["duration_s"] >= WINDOW_S
    # The incident is written before its message goes out: that may still be on its way.
    wait_for(lambda: messages(hooks, "/generic", "QUEUE_FULL"), timeout_s=10, what="the message")
    (first,) = messages(hooks, "/generic", "QUEUE_FULL")
    assert first.body["line"] == "order"
    assert first.body["count"] == 1
    assert first.body["details"] == {
        "depth": 1,
        "limit": 1,
        "policy": "reject",
        "incident_id": incident["id"],
    }
    generic = [first]
    expected = hmac.new(GENERIC_SECRET.encode(), first.raw, hashlib.sha256).hexdigest()
    assert first.headers["x-signature"] == expected

    # Each alert goes to the hooks one after the other: the last may still be on its way.
    wait_for(
        lambda: (
            len(messages(hooks, "/ding", "QUEUE_FULL")) >= len(generic)
            and len(messages(hooks, "/slack", "QUEUE_FULL")) >= len(generic)
        ),
        timeout_s=10,
        what="the DingTalk and Slack copies of each message",
    )
    ding = messages(hooks, "/ding", "QUEUE_FULL")
    assert len(ding) == len(generic)
    query = ding[0].query
    assert query["access_token"] == "t"
    string_to_sign = f"{query['timestamp']}\n{DING_SECRET}".encode()
    sign = base64.b64encode(
        hmac.new(DING_SECRET.encode(), string_to_sign, hashlib.sha256).digest()
    ).decode()
    assert query["sign"] == sign
    assert abs(int(query["timestamp"]) / 1000 - time.time()) < 3600
    assert ding[0].body["msgtype"] == "markdown"
    assert "QUEUE_FULL" in ding[0].body["markdown"]["text"]

    slack = messages(hooks, "/slack", "QUEUE_FULL")
    assert len(slack) == len(generic)
    assert slack[0].body["text"].startswith("QUEUE_FULL [order]")


def test_a_burst_of_deaths_is_folded_into_one_message_per_window(harness, hooks):
    # Point events are not incidents: the first goes at once, the rest of its window are
    # folded into one message when the window closes, with how many they were.
    rt = harness.runtime()
    for n in range(500):
        rt.alerts.raise_event(
            Event.TASK_DEAD, line="refund", message=f"record R{n} is dead", record_id=f"R{n}"
        )

    def all_counted() -> bool:
        return sum(m.body["count"] for m in messages(hooks, "/generic", "TASK_DEAD")) >= 500

    wait_for(all_counted, timeout_s=WINDOW_S * 4, what="the folded count")
    dead = messages(hooks, "/generic", "TASK_DEAD")
    assert [m.body["count"] for m in dead] == [1, 499]
    assert dead[1].at_s - dead[0].at_s >= WINDOW_S * 0.8


def test_a_dead_record_yields_task_dead_with_its_id_and_business_no(harness, hooks):
    harness.configure(
        lines__refund__handler="tests.support.handlers:always_fail",
        lines__refund__max_attempts="1",
    )
    client = harness.start_intake()
    harness.start_worker("refund")
    record_id = client.post("/v1/refund", json={"business_no": "RF-77"}).json()["id"]
    harness.wait_until_final({record_id})
    wait_for(lambda: messages(hooks, "/generic", "TASK_DEAD"), timeout_s=15, what="TASK_DEAD")
    (dead,) = messages(hooks, "/generic", "TASK_DEAD")
    assert dead.body["line"] == "refund"
    assert dead.body["details"]["record_id"] == record_id
    assert dead.body["details"]["business_no"] == "RF-77"


def test_stopping_the_order_worker_with_work_waiting_yields_no_consumer(harness, hooks):
    # Alerts are not held back for a window: the monitor may run between two of the posts
    # below, and the next run's alert must then carry all three.
    harness.configure(
        monitor_interval_seconds="1", worker_heartbeat_ttl_seconds="3", alert_window_seconds="0.5"
    )
    client = harness.start_intake()
    worker = harness.start_worker("order")
    harness.start_worker("refund")
    harness.start_beat()

    def live(line: str) -> int | None:
        rows = client.get("/v1/lines").json()["lines"]
        return next(row["live_workers"] for row in rows if row["line"] == line)

    wait_for(lambda: live("order") == 1, timeout_s=20, what="the order worker's heartbeat")
    # Proves an absence, so time must pass: two runs of the 1 s monitor (beat ticks at
    # least once a second) with a live worker, and no NO_CONSUMER. Nothing marks a run
    # that raised nothing, so there is no condition to wait on instead.
    time.sleep(2.5)
    assert not messages(hooks, "/generic", "NO_CONSUMER")

    worker.stop()
    assert live("order") == 0  # a graceful stop removes its heartbeat at once
    stopped_at = time.monotonic()
    for n in range(3):
        assert client.post("/v1/order", json={"business_no": f"WAIT-{n}"}).status_code == 202

    def all_three_counted() -> bool:
        alerts = client.get("/v1/alerts").json()["alerts"]
        found = [a for a in alerts if a["event"] == "NO_CONSUMER"]
        return bool(found) and found[0]["figures"]["waiting"] >= 3

    # One incident: one message when it opens (it may count one, two or three records),
    # then the monitor's runs update its figures, without a message each.
    wait_for(all_three_counted, timeout_s=60, what="NO_CONSUMER with the 3 records waiting")
    assert time.monotonic() - stopped_at < 60
    # The incident is written before its message goes out: that may still be on its way.
    wait_for(lambda: messages(hooks, "/generic", "NO_CONSUMER"), timeout_s=10, what="the message")
    alerts = messages(hooks, "/generic", "NO_CONSUMER")
    assert len(alerts) == 1
    assert alerts[0].body["line"] == "order"


def test_a_webhook_that_never_answers_costs_the_intake_nothing(harness):
    silent = SilentServer()
    try:
        harness.configure(
            alert_window_seconds="0.01",
            alert_webhooks=json.dumps([{"kind": "generic", "url": silent.url}]),
            lines__order__max_queue_length="1",
            lines__order__overflow="reject",
        )
        client = harness.start_intake()
        codes = []
        for n in range(60):
            started = time.monotonic()
            response = client.post("/v1/order", json={"business_no": f"H-{n}"})
            assert time.monotonic() - started < 2.0
            codes.append(response.status_code)
        assert codes == [202] + [429] * 59
        assert silent.held  # the alerts did go out, and hang there
    finally:
        silent.stop()


FLOOD_S = 4.0
FLOOD_RAISES = 2000


def _flood(n: int, ready: Any, go: Any, out: Any) -> None:
    """One process of the flood: raises QUEUE_FULL in a tight loop for `FLOOD_S` (and at
    least `FLOOD_RAISES` times); process 0 raises CALLER_RUNS a second in."""
    settings = load_settings()
    client = make_redis(settings.redis_url, redis_options(settings))
    telemetry = Telemetry(client, interval_s=3600)
    alerter = Alerter(settings, clock=utcnow, telemetry=telemetry)
    raised, caller_runs_at = 0, None
    try:
        ready.put(n)
        go.wait(timeout=30)
        started = time.monotonic()
        while time.monotonic() - started < FLOOD_S or raised < FLOOD_RAISES:
            alerter.raise_event(
                Event.QUEUE_FULL,
                line="order",
                message="queue 'order' is full (1/1); policy caller_runs",
                depth=1,
                limit=1,
                policy="caller_runs",
            )
            raised += 1
            if n == 0 and caller_runs_at is None and time.monotonic() - started >= 1.0:
                caller_runs_at = time.monotonic()  # system-wide: comparable across processes
                alerter.raise_event(Event.CALLER_RUNS, line="order", message="the caller ran it")
        flushed = alerter.flush(timeout_s=15)
    finally:
        alerter.close()
        telemetry.close()
        client.close()
    out.put((n, raised, caller_runs_at, flushed))


def _script_calls(client: Any) -> int:
    """How many Lua scripts Redis has run (the incidents' writes are scripts)."""
    stats = client.info("commandstats")
    return sum(
        int(stats.get(name, {}).get("calls", 0)) for name in ("cmdstat_eval", "cmdstat_evalsha")
    )


def test_a_flood_of_queue_full_from_three_processes_is_one_message_and_lets_events_through(
    harness,
):
    # The intake raises QUEUE_FULL once per record that did not fit: under a flood, three
    # processes raise it thousands of times at once. Their raises are folded and written
    # at most once per flush, so the incident opens once (one message), every raise is
    # counted, and a point event raised meanwhile goes out at once, not after the flood.
    recorder = Recorder().start()
    harness.configure(
        alert_window_seconds="60",
        alert_webhooks=json.dumps([{"kind": "generic", "url": f"{recorder.url}/generic"}]),
    )
    context = multiprocessing.get_context("spawn")
    ready, out, go = context.Queue(), context.Queue(), context.Event()
    processes = [context.Process(target=_flood, args=(n, ready, go, out)) for n in range(3)]

    def sent(event: str) -> list:
        return [r for r in recorder.snapshot() if r.body and r.body.get("event") == event]

    redis_client = harness.runtime().redis
    try:
        for process in processes:
            process.start()
        for _ in processes:
            ready.get(timeout=60)
        scripts_before = _script_calls(redis_client)
        started = time.monotonic()
        go.set()
        results = sorted(out.get(timeout=FLOOD_S + 60) for _ in processes)
        elapsed = time.monotonic() - started
        # At most one write of the incident per process and flush interval (and a last
        # one at close), not one per raise nor a tight loop of them.
        writes = _script_calls(redis_client) - scripts_before
        assert writes <= len(processes) * (elapsed / FLUSH_INTERVAL_S + 3)
        for process in processes:
            process.join(timeout=10)
        assert all(flushed for _n, _raised, _at, flushed in results)
        raised = [count for _n, count, _at, _flushed in results]
        assert min(raised) >= FLOOD_RAISES
        caller_runs_at = results[0][2]
        assert caller_runs_at is not None

        wait_for(lambda: sent("CALLER_RUNS"), timeout_s=10, what="CALLER_RUNS")
        (caller_runs,) = sent("CALLER_RUNS")
        # During the flood, not after it: raised a second in, it went out before the
        # flood's last QUEUE_FULL was raised.
        assert caller_runs.at_s - caller_runs_at < FLOOD_S - 1.0
        wait_for(lambda: sent("QUEUE_FULL"), timeout_s=10, what="the QUEUE_FULL message")
        (incident,) = IncidentBook(redis_client).open_incidents()
        assert incident.count == sum(raised)
        assert len(sent("QUEUE_FULL")) == 1
        assert sent("QUEUE_FULL")[0].body["details"]["incident_id"] == incident.id
    finally:
        go.set()
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
        recorder.stop()
