"""Outages: Redis down while posting, and a journal that cannot be reached."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from app.journal import engine as journal_engine
from app.local.embedded_redis import RedisServer
from tests.support.processes import free_port, wait_for

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal


def test_posts_while_redis_is_down_stay_received_and_the_sweeper_delivers_them(harness, tmp_path):
    server = RedisServer(port=free_port(), workdir=tmp_path / "redis")
    server.start()
    try:
        harness.configure(redis_url=server.url)
        client = harness.start_intake()
        harness.start_worker("order")
        harness.start_beat()
        before = client.post("/v1/order", json={"business_no": "UP-1"}).json()
        harness.wait_until_final({before["id"]})

        server.stop()
        ids = set()
        for n in range(20):
            response = client.post("/v1/order", json={"business_no": f"DOWN-{n}"})
            assert response.status_code == 202, response.text
            assert response.json()["status"] == "received"
            ids.add(response.json()["id"])
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["failed"] == ["redis"]
        assert {r.status.value for r in harness.records() if r.id in ids} == {"received"}

        server.start()  # the same port, and empty: nothing of the 20 was ever on a queue
        final = harness.wait_until_final(ids, timeout_s=90)
        assert {r.status.value for r in final.values()} == {"done"}
        rows = harness.rows("SELECT business_no FROM orders")
        assert sorted(row[0] for row in rows) == sorted(["UP-1", *(f"DOWN-{n}" for n in range(20))])
    finally:
        server.stop()


def test_unreachable_journal_answers_503_and_enqueues_nothing(harness, tmp_path, redis_server):
    if harness.env["PIPELINE_DATABASE_URL"].startswith("sqlite"):
        unreachable = f"sqlite:///{tmp_path}/no-such-dir/journal.db"
    else:
        unreachable = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/journal"
    harness.configure(database_url=unreachable)
    client = harness.start_intake()
    response = client.post("/v1/order", json={"business_no": "A-1"})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "journal_unavailable"
    assert "A-1" not in response.text
    assert "sqlite" not in response.text.lower()
    assert "postgresql" not in response.text.lower()
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["failed"] == ["journal"]
    assert client.get("/healthz").status_code == 200
    redis = redis_server.client()
    try:
        assert redis.llen("order") == 0
    finally:
        redis.close()


def test_a_pooled_journal_connection_dropped_while_idle_is_replaced_before_use(
    database_url, monkeypatch
):
    """A connection idle in the pool past `PING_AFTER_IDLE_S` is pinged before use: one the
    server (or a proxy) dropped meanwhile is replaced, and the transaction does not fail."""
    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only: a SQLite journal has no connection to drop")
    monkeypatch.setattr(journal_engine, "PING_AFTER_IDLE_S", 0.2)
    engine = journal_engine.make_engine(database_url)
    admin = create_engine(database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            dropped = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        idle_since = time.monotonic()  # back in the pool
        with admin.connect() as conn:
            assert conn.exec_driver_sql(f"SELECT pg_terminate_backend({dropped})").scalar()

        def backend_gone() -> bool:
            with admin.connect() as conn:
                found = conn.execute(
                    text("SELECT 1 FROM pg_stat_activity WHERE pid = :pid"), {"pid": dropped}
                )
                return found.first() is None

        wait_for(backend_gone, timeout_s=30, what="the terminated backend to exit")
        # And idle past the threshold: a matter of the clock, with nothing to poll.
        idle_s = time.monotonic() - idle_since
        time.sleep(max(0.0, journal_engine.PING_AFTER_IDLE_S + 0.1 - idle_s))
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar() != dropped
    finally:
        engine.dispose()
        admin.dispose()
