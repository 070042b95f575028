"""The reads and switches the operator's console uses, on a real Redis and journal: the
health of each part with its reason, done and failed per minute summed over processes,
a record's detail (payload size, attempts, audit rows; never the payload when asked),
schedules with enable and disable, and alerts with their reason and figures. Bad input is
a clear 4xx; admin endpoints ask for the token."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest

from app.clock import utcnow
from app.journal.models import RecordStatus
from app.observe.health import note_active_beat, note_sweep
from app.observe.liveness import ConsumerReport, publish_heartbeat
from app.schedules.cron import Misfire
from app.schedules.store import add
from app.telemetry import throughput
from app.telemetry.counters import Counter, Telemetry
from app.telemetry.events import Event
from beat.lock import BeatLock
from tests.support.journal import journal_records
from tests.support.processes import free_port

pytestmark = pytest.mark.journal

TOKEN = "console-api-token-0123"
ADMIN = {"authorization": f"Bearer {TOKEN}"}


def checks(client) -> dict[str, dict]:
    answer = client.get("/v1/health")
    assert answer.status_code == 200, answer.text
    return {check["name"]: check for check in answer.json()["checks"]}


def test_health_names_each_part_and_says_why_one_fails(harness):
    harness.configure(admin_token=TOKEN)
    rt = harness.runtime()
    client = harness.start_intake()

    found = checks(client)
    assert list(found) == ["redis", "journal", "beat", "sweep", "schedules"]
    assert (found["redis"]["ok"], found["journal"]["ok"]) == (True, True)
    assert found["beat"]["ok"] is False
    assert found["beat"]["reason"].startswith("no beat holds the lock")
    assert found["sweep"]["ok"] is False
    assert found["sweep"]["reason"].startswith("no sweep has run")
    assert (found["schedules"]["ok"], found["schedules"]["reason"]) == (True, "no schedule enabled")
    assert client.get("/v1/health").json()["ok"] is False

    # A beat takes the lock, notes itself and sweeps, as the active beat does.
    lock = BeatLock(rt.redis, ttl_s=10)
    assert lock.hold() == (True, None)
    since = lock.active_since()
    note_active_beat(
        rt.redis, identity=lock.identity, since=since - timedelta(seconds=30), ttl_s=10
    )
    note_sweep(rt.redis, at=utcnow())
    found = checks(client)
    beat = found["beat"]
    assert beat["ok"] is True
    assert beat["host"] == lock.identity.split(":")[0]
    assert beat["holder"] == lock.identity
    assert 30 <= beat["lock_age_s"] < 60
    assert 0 <= beat["renewed_s_ago"] <= 10
    assert found["sweep"]["ok"] is True
    assert found["sweep"]["age_s"] < 10

    # A sweep long ago, and a schedule whose fire is overdue: each fails with why.
    note_sweep(rt.redis, at=utcnow() - timedelta(minutes=5))
    with rt.engine.begin() as conn:
        add(
            conn,
            name="nightly",
            cron="0 2 * * *",
            timezone="UTC",
            line="order",
            payload={},
            misfire=Misfire.FIRE_ONCE,
            catchup_window_s=3600,
            now=utcnow() - timedelta(days=2),
        )
    found = checks(client)
    assert found["sweep"]["ok"] is False
    # 300 s, and what the schedule's insert and the request took since (a loaded CI: 301).
    said = re.search(r"the last sweep finished (\d+) s ago", found["sweep"]["reason"])
    assert said is not None, found["sweep"]["reason"]
    assert 300 <= int(said.group(1)) <= 330
    assert found["schedules"]["ok"] is False
    assert "1 schedule(s) late: 'nightly' was due" in found["schedules"]["reason"]
    assert found["schedules"]["late"] == ["nightly"]
    lock.release()


def test_health_with_redis_down_says_so_and_still_answers(harness):
    harness.configure(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    client = harness.start_intake()
    found = checks(client)
    assert found["redis"]["ok"] is False
    assert found["redis"]["reason"].startswith("Redis does not answer (")
    assert found["beat"]["reason"] == "unknown: Redis does not answer"
    assert found["journal"]["ok"] is True
    throughput_answer = client.get("/v1/throughput")
    assert throughput_answer.status_code == 503
    assert throughput_answer.json()["error"]["code"] == "broker_unavailable"


def test_throughput_sums_the_outcomes_of_every_process_per_minute(harness):
    rt = harness.runtime()
    now = utcnow()
    an_hour_ago = now - timedelta(minutes=59)
    # Two processes (two hosts, say) count outcomes of the order line.
    first = Telemetry(rt.redis, clock=lambda: now)
    second = Telemetry(rt.redis, clock=lambda: now)
    older = Telemetry(rt.redis, clock=lambda: an_hour_ago)
    try:
        first.count(Counter.DONE, 3, line="order")
        second.count(Counter.DONE, 2, line="order")
        second.count(Counter.FAILED, line="order")
        second.count(Counter.DEAD, line="order")  # its last attempt failed too
        older.count(Counter.DONE, 7, line="order")
        first.count(Counter.INTAKE, line="order", outcome="accepted")  # not an outcome
        assert first.flush()
        assert second.flush()
        assert older.flush()
    finally:
        for telemetry in (first, second, older):
            telemetry.close()
    key = throughput.bucket_key("order", throughput.minute_of(now))
    assert 0 < rt.redis.ttl(key) <= throughput.KEEP_S
    client = harness.start_intake()

    answer = client.get("/v1/throughput", params={"minutes": 60})

    assert answer.status_code == 200, answer.text
    lines = {row["line"]: row["per_minute"] for row in answer.json()["lines"]}
    assert set(lines) == {"order", "refund", "status"}
    order = lines["order"]
    assert len(order) == 60
    assert (order[-1]["done"], order[-1]["failed"]) == (5, 2)
    assert (order[0]["done"], order[0]["failed"]) == (7, 0)
    assert sum(m["done"] for m in order[1:-1]) == 0
    assert order[-1]["minute"].endswith("+00:00")
    assert all(m["done"] == m["failed"] == 0 for m in lines["refund"])
    for bad in ("0", "121", "many"):
        refused = client.get("/v1/throughput", params={"minutes": bad})
        assert refused.status_code == 422
        assert refused.json()["error"]["code"] == "invalid_request"
        assert "minutes" in refused.json()["error"]["message"]


def test_a_records_detail_shows_its_size_attempts_and_audit_rows_without_its_payload(harness):
    harness.configure(admin_token=TOKEN)
    rt = harness.runtime()
    payload = {"business_no": "D-1", "card": "SECRET-4111", "note": "é"}
    (dead,) = journal_records(rt, [payload], line="order", status=RecordStatus.DEAD)
    (other,) = journal_records(rt, [{"business_no": "D-2"}], line="order", status=RecordStatus.DEAD)
    client = harness.start_intake()
    retried = client.post(f"/v1/records/{dead}/retry", json={"reason": "fixed"}, headers=ADMIN)
    assert retried.status_code == 200, retried.text
    cancelled = client.post(f"/v1/records/{other}/cancel", json={"reason": "dup"}, headers=ADMIN)
    assert cancelled.status_code == 200, cancelled.text

    shown = client.get(f"/v1/records/{dead}", params={"include_payload": "false"}, headers=ADMIN)

    assert shown.status_code == 200, shown.text
    detail = shown.json()
    assert "payload" not in detail
    assert "SECRET-4111" not in shown.text
    compact = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    assert detail["payload_bytes"] == len(compact)
    assert detail["attempt_history"] == []
    assert "next_attempt_at" in detail
    assert [(a["action"], a["target"], a["reason"]) for a in detail["audit"]] == [
        ("retry", f"record:{dead}", "fixed")
    ]
    assert detail["audit"][0]["result"] == {"from": "dead", "to": "enqueued"}
    # By default the record is whole, as before.
    assert client.get(f"/v1/records/{dead}", headers=ADMIN).json()["payload"] == payload
    listed = client.get("/v1/records", params={"include_payload": "false"}, headers=ADMIN).json()
    assert all("payload" not in item and item["payload_bytes"] > 0 for item in listed["items"])
    # The audit log by target.
    rows = client.get("/v1/audit", params={"target": f"record:{other}"}, headers=ADMIN).json()
    assert [row["action"] for row in rows["items"]] == ["cancel"]
    # Bad input and missing tokens.
    assert client.get(f"/v1/records/{dead}").status_code == 401
    assert (
        client.get(f"/v1/records/{dead}", headers={"authorization": "Bearer no"}).status_code == 403
    )
    missing = client.get("/v1/records/nope", headers=ADMIN)
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "record_not_found")
    bad_flag = client.get(
        f"/v1/records/{dead}", params={"include_payload": "perhaps"}, headers=ADMIN
    )
    assert bad_flag.status_code == 422
    assert "include_payload" in bad_flag.json()["error"]["message"]
    for target in ("", "x" * 300, "a\x00b"):
        refused = client.get("/v1/audit", params={"target": target}, headers=ADMIN)
        assert refused.status_code == 422, target
        assert refused.json()["error"]["code"] == "invalid_request"


def test_schedules_are_listed_and_switched_by_an_admin_with_an_audit_row(harness):
    harness.configure(admin_token=TOKEN)
    rt = harness.runtime()
    added_at = utcnow()
    with rt.engine.begin() as conn:
        add(
            conn,
            name="hourly-sync",
            cron="0 * * * *",
            timezone="Europe/Paris",
            line="status",
            payload={"status": "sync", "secret": "SCHEDULE-SECRET"},
            misfire=Misfire.SKIP,
            catchup_window_s=600,
            now=added_at,
        )
    client = harness.start_intake()
    assert client.get("/v1/schedules").status_code == 401
    assert client.post("/v1/schedules/hourly-sync/disable").status_code == 401

    listed = client.get("/v1/schedules", headers=ADMIN)
    assert listed.status_code == 200, listed.text
    (shown,) = listed.json()["items"]
    assert "SCHEDULE-SECRET" not in listed.text
    assert {k: shown[k] for k in ("name", "cron", "timezone", "line", "enabled", "misfire")} == {
        "name": "hourly-sync",
        "cron": "0 * * * *",
        "timezone": "Europe/Paris",
        "line": "status",
        "enabled": True,
        "misfire": "skip",
    }
    assert shown["last_fire_at"] is None
    assert shown["next_fire_at"] > added_at.isoformat()
    assert shown["late_s"] is None

    off = client.post(
        "/v1/schedules/hourly-sync/disable", json={"reason": "maintenance"}, headers=ADMIN
    )
    assert off.status_code == 200, off.text
    assert (off.json()["enabled"], off.json()["next_fire_at"]) == (False, None)
    again = client.post("/v1/schedules/hourly-sync/disable", headers=ADMIN)
    assert again.json()["enabled"] is False
    on = client.post("/v1/schedules/hourly-sync/enable", headers=ADMIN)
    assert on.json()["enabled"] is True
    audit = client.get("/v1/audit", params={"target": "schedule:hourly-sync"}, headers=ADMIN)
    rows = [(r["action"], r["actor"], r["reason"]) for r in audit.json()["items"]]
    # Newest first; disabling a disabled schedule changed nothing and wrote nothing.
    assert rows == [
        ("schedule_enable", "admin", None),
        ("schedule_disable", "admin", "maintenance"),
    ]

    unknown = client.post("/v1/schedules/nope/enable", headers=ADMIN)
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "schedule_not_found")
    assert "no schedule 'nope'" in unknown.json()["error"]["message"]
    spaced = client.post("/v1/schedules/two%20words/enable", headers=ADMIN)
    assert spaced.status_code == 422
    extra = client.post("/v1/schedules/hourly-sync/enable", json={"why": "x"}, headers=ADMIN)
    assert extra.status_code == 422
    assert "why" in extra.json()["error"]["message"]
    long_reason = client.post(
        "/v1/schedules/hourly-sync/enable", json={"reason": "r" * 501}, headers=ADMIN
    )
    assert long_reason.status_code == 422


def test_alerts_carry_their_reason_and_figures_and_dry_runs_are_kept_apart(harness):
    rt = harness.runtime()
    rt.alerts.raise_event(
        Event.TASK_DEAD,
        line="order",
        message="record R1 (B-1) is dead after 8 attempts",
        record_id="R1",
        attempts=8,
        error="DeliveryFailed: HTTP 500 with the downstream's body",
    )
    rt.alerts.raise_event(
        Event.REPLAY_FINISHED,
        line="refund",
        message="replay by x: 3 matched",
        dry_run=True,
        matched=3,
    )
    rt.alerts.close()
    assert rt.telemetry.flush()
    client = harness.start_intake()

    every = client.get("/v1/alerts").json()["alerts"]
    assert [a["event"] for a in every] == ["REPLAY_FINISHED", "TASK_DEAD"]
    dead = every[1]
    assert dead["reason"] == "record R1 (B-1) is dead after 8 attempts"
    assert dead["figures"] == {"record_id": "R1", "attempts": 8}  # no error text
    assert dead["dry_run"] is False
    assert every[0]["dry_run"] is True
    real = client.get("/v1/alerts", params={"dry_run": "false"}).json()["alerts"]
    assert [a["event"] for a in real] == ["TASK_DEAD"]
    dry = client.get("/v1/alerts", params={"dry_run": "true"}).json()["alerts"]
    assert [a["event"] for a in dry] == ["REPLAY_FINISHED"]
    refused = client.get("/v1/alerts", params={"dry_run": "maybe"})
    assert refused.status_code == 422
    assert client.get("/v1/alerts", params={"limit": "51"}).status_code == 422


def test_lines_count_stalled_workers_apart_from_live_ones(harness):
    rt = harness.runtime()
    stalled = ConsumerReport(stalled=True, taken=0, consuming=True, held=0, slots=1, starved_s=60)
    publish_heartbeat(rt.redis, line="order", hostname="w1", pid=1, ttl_s=30, now=utcnow())
    publish_heartbeat(
        rt.redis, line="order", hostname="w2", pid=2, ttl_s=30, now=utcnow(), consumer=stalled
    )
    client = harness.start_intake()
    order = client.get("/v1/lines").json()["lines"][0]
    assert (order["line"], order["live_workers"], order["stalled_workers"]) == ("order", 1, 1)


@pytest.mark.journal_independent
def test_the_console_is_served_from_the_package_and_loads_nothing_from_elsewhere(harness):
    client = harness.start_intake()
    page = client.get("/")
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy
    assert "http://" not in page.text
    assert "https://" not in page.text
    for name, kind in (("console.js", "text/javascript"), ("console.css", "text/css")):
        asset = client.get(f"/console/{name}")
        assert asset.status_code == 200
        assert asset.headers["content-type"].startswith(kind)
        assert "https://" not in asset.text
    for name in ("nope.js", "..%2Fstatus.html", "status.html"):
        missing = client.get(f"/console/{name}")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
