"""Counters and the operator's endpoints when Redis goes away: nothing counted is lost,
and `/metrics` still answers with what the journal knows."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from app.config.redis import make_redis
from app.config.settings import load_settings, redis_options
from app.local.embedded_redis import RedisServer
from app.telemetry.counters import Counter, Telemetry, encode, read_counters
from tests.support.processes import free_port


def test_counts_made_while_redis_is_down_arrive_when_it_is_back(tmp_path, monkeypatch):
    server = RedisServer(port=free_port(), workdir=tmp_path)
    server.start()
    monkeypatch.setenv("PIPELINE_REDIS_CONNECT_TIMEOUT_SECONDS", "0.5")
    client = make_redis(server.url, redis_options(load_settings()))
    telemetry = Telemetry(client, interval_s=3600)  # flushed by hand below
    try:
        telemetry.count(Counter.DONE, line="order")
        telemetry.note_alert({"event": "QUEUE_FULL", "line": "order", "message": "full"})
        assert telemetry.flush()
        server.stop()
        telemetry.count(Counter.DONE, 2, line="order")
        telemetry.count(Counter.DEAD, line="refund")
        telemetry.note_alert({"event": "TASK_DEAD", "line": "refund", "message": "dead"})
        assert not telemetry.flush()
        assert not telemetry.flush()  # a second failure keeps them too
        server.start()
        assert telemetry.flush()
        # The server restarted empty: what it held is gone, what waited in memory arrived.
        counters = read_counters(client)
        assert counters == {
            encode(Counter.DONE, {"line": "order"}): 2,
            encode(Counter.DEAD, {"line": "refund"}): 1,
        }
        assert [a.decode() for a in client.lrange("pipeline:alerts:recent", 0, -1)] == [
            '{"event": "TASK_DEAD", "line": "refund", "message": "dead"}'
        ]
    finally:
        telemetry.close()
        client.close()
        server.stop()


def test_metrics_and_status_page_answer_while_redis_is_down(harness):
    harness.configure(
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        redis_connect_timeout_seconds="0.5",
    )
    client = harness.start_intake()
    response = client.post("/v1/order", json={"business_no": "ORD-1"})
    assert response.status_code == 202
    assert response.json()["status"] == "received"  # journaled; the sweeper pushes it later

    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.text)
        for s in family.samples
    }
    assert found[("pipeline_redis_up", ())] == 0
    assert found[("pipeline_journal_up", ())] == 1
    assert found[("pipeline_records", (("line", "order"), ("status", "received")))] == 1
    assert not any(name == "pipeline_queue_depth" for name, _ in found)

    alerts = client.get("/v1/alerts")
    assert alerts.status_code == 503
    assert alerts.json()["error"]["code"] == "broker_unavailable"
    lines = client.get("/v1/lines").json()["lines"]
    assert [row["queue_depth"] for row in lines] == [None, None, None]
    page = client.get("/")
    assert page.status_code == 200
    assert "Pipeline console" in page.text
