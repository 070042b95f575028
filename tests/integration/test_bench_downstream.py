"""The delivery scenario's downstream (`python -m app.bench.downstream`), a real process on
127.0.0.1: it answers 200 to what it is sent and counts requests, distinct Idempotency-Keys
and the most it held at once."""

from __future__ import annotations

import sys
import threading

import httpx
import pytest

from app.local.processes import Child
from tests.support.processes import free_port, wait_for

# Long enough that three requests sent at once are all held together, however loaded the
# machine: the test checks that they were counted as held at once, not how fast.
DELAY_MS = 1000


def _listening(url: str) -> bool:
    try:
        return httpx.get(f"{url}/stats", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def downstream():
    port = free_port()
    argv = [sys.executable, "-m", "app.bench.downstream", str(port), str(DELAY_MS)]
    process = Child("downstream", argv).start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _listening(url), timeout_s=30, what="the downstream to listen")
        yield url
    finally:
        process.stop(timeout_s=10)


@pytest.mark.timeout(60)
def test_downstream_counts_requests_distinct_keys_and_most_in_flight(downstream):
    assert httpx.get(f"{downstream}/stats", timeout=10).json() == {
        "requests": 0,
        "distinct_keys": 0,
        "max_in_flight": 0,
    }
    statuses: list[int] = []

    def post(key: str) -> None:
        response = httpx.post(
            f"{downstream}/deliveries",
            json={"id": key},
            headers={"Idempotency-Key": key},
            timeout=30,
        )
        statuses.append(response.status_code)

    threads = [threading.Thread(target=post, args=(key,)) for key in ("a", "a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert statuses == [200, 200, 200]
    # One client, one keep-alive connection, requests one after another.
    with httpx.Client(timeout=30) as client:
        for key in ("c", "d"):
            answer = client.post(f"{downstream}/x", content=b"{}", headers={"idempotency-key": key})
            assert (answer.status_code, answer.json()) == (200, {})
    assert httpx.get(f"{downstream}/stats", timeout=10).json() == {
        "requests": 5,
        "distinct_keys": 4,
        "max_in_flight": 3,
    }
