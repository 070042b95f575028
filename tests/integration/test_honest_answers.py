"""An honest answer whatever Redis and the journal do: a committed record is answered 202
within the intake's answer budget, even while Redis does not answer at all (`received`:
the sweeper pushes it later), and 503 ("nothing was accepted") only when nothing was
committed, even when the journal takes longer than the budget."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from app.local.embedded_redis import RedisServer
from tests.support.processes import free_port

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal

# The answer budget these tests configure: the journal's wait, then the push's.
JOURNAL_WAIT_S = 1.0
PUSH_WAIT_S = 0.5
# What a stopped Redis would cost an answer that waited on it: the client's socket timeout.
REDIS_SOCKET_TIMEOUT_S = 5.0


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process `pid` frozen (SIGSTOP) for the block: it keeps its sockets and answers
    nothing, as a Redis stalled behind a proxy or a partition without a reset would."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_stopped_redis_never_holds_the_answer_of_a_committed_record(harness, tmp_path):
    server = RedisServer(port=free_port(), workdir=tmp_path / "redis")
    server.start()
    try:
        harness.configure(
            redis_url=server.url,
            redis_socket_timeout_seconds=str(REDIS_SOCKET_TIMEOUT_S),
            journal_timeout_seconds=str(JOURNAL_WAIT_S),
            intake_push_wait_seconds=str(PUSH_WAIT_S),
        )
        client = harness.start_intake()
        first = client.post("/v1/order", json={"business_no": "UP-1"})
        assert first.status_code == 202, first.text
        assert first.json()["status"] == "enqueued"
        assert server.pid is not None
        answers: list[tuple[int, dict[str, str], float]] = []
        with stopped(server.pid):
            for n in range(5):
                began = time.monotonic()
                response = client.post("/v1/order", json={"business_no": f"STOP-{n}"})
                answers.append((response.status_code, response.json(), time.monotonic() - began))
        for status_code, body, took_s in answers:
            assert status_code == 202, body
            assert body["status"] == "received", body
            # Within the budget, not after the Redis client's socket timeout.
            assert took_s < REDIS_SOCKET_TIMEOUT_S - 1, took_s
        # Each answered record is journaled once, and each ends done once, pushed by the
        # sweeper (or by the intake's push, which Redis ran once it went on).
        harness.start_worker("order")
        harness.start_beat()
        ids = {first.json()["id"], *(body["id"] for _code, body, _took in answers)}
        final = harness.wait_until_final(ids, timeout_s=90)
        assert {r.status.value for r in final.values()} == {"done"}
        journaled = harness.rows("SELECT business_no FROM records WHERE business_no LIKE 'STOP-%'")
        assert sorted(row[0] for row in journaled) == [f"STOP-{n}" for n in range(5)]
        delivered = harness.rows("SELECT business_no FROM orders")
        assert sorted(row[0] for row in delivered) == sorted(
            ["UP-1", *(f"STOP-{n}" for n in range(5))]
        )
    finally:
        server.stop()


@contextmanager
def journal_held(database_url: str) -> Iterator[None]:
    """Every write to the journal waits while the block runs: another session holds the
    write lock (SQLite) or an exclusive lock on the records (PostgreSQL)."""
    hold = threading.Event()
    released = threading.Event()
    ready = threading.Event()

    def holder() -> None:
        if database_url.startswith("sqlite"):
            path = database_url.removeprefix("sqlite:///")
            conn = sqlite3.connect(path, timeout=10, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                ready.set()
                hold.wait(timeout=30)
                conn.execute("ROLLBACK")
            finally:
                conn.close()
        else:
            engine = create_engine(database_url, poolclass=NullPool)
            try:
                with engine.begin() as conn:
                    conn.execute(text("LOCK TABLE records IN EXCLUSIVE MODE"))
                    ready.set()
                    hold.wait(timeout=30)
            finally:
                engine.dispose()
        released.set()

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    assert ready.wait(timeout=10), "the journal's lock was not taken"
    try:
        yield
    finally:
        hold.set()
        thread.join(timeout=15)
        assert released.is_set()


def test_a_journal_slower_than_the_budget_answers_503_only_when_nothing_was_committed(harness):
    harness.configure(journal_timeout_seconds=str(JOURNAL_WAIT_S))
    client = harness.start_intake()
    warm = client.post("/v1/order", json={"business_no": "WARM-1"})
    assert warm.status_code == 202, warm.text
    answers: dict[str, httpx.Response] = {}

    def post(business_no: str) -> None:
        answers[business_no] = client.post("/v1/order", json={"business_no": business_no})

    with journal_held(harness.env["PIPELINE_DATABASE_URL"]):
        senders = [threading.Thread(target=post, args=(f"SLOW-{n}",)) for n in range(3)]
        for sender in senders:
            sender.start()
        # Longer than the budget: each sender has its answer before the journal goes on.
        for sender in senders:
            sender.join(timeout=JOURNAL_WAIT_S * 4 + 10)
        answered_while_held = dict(answers)
    for sender in senders:
        sender.join(timeout=30)
    assert set(answers) == {f"SLOW-{n}" for n in range(3)}
    # The journal goes on: whatever was waiting is written now, or was given up.
    after = client.post("/v1/order", json={"business_no": "AFTER-1"})
    assert after.status_code == 202, after.text
    time.sleep(2)  # a write given up must not land late: give it the time to try
    kept = {row[0] for row in harness.rows("SELECT business_no FROM records")}
    for business_no, response in answers.items():
        if response.status_code == 503:
            assert response.json()["error"]["code"] == "journal_unavailable", response.text
            assert business_no not in kept, f"{business_no} was answered 503 and committed"
        else:
            assert response.status_code == 202, response.text
            assert business_no in kept
    # The lock outlived the budget: the answers came while it was held, and said 503.
    assert {r.status_code for r in answered_while_held.values()} == {503}
