"""A journal behind a network that swallows everything (a blackhole: no answer, no reset).
The intake answers 503 within its journal timeout instead of hanging, claims nothing, and
serves again once the network does."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy.engine import make_url

from tests.support.processes import wait_for
from tests.support.proxy import IdleProxy

# Runs on every journal database (SQLite and PostgreSQL).
pytestmark = pytest.mark.journal


def test_a_blackholed_journal_gets_503_not_a_hang_and_the_intake_recovers(harness, database_url):
    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only: an SQLite journal has no connection to blackhole")
    url = make_url(database_url)
    proxy = IdleProxy(upstream_port=url.port or 5432, idle_s=3600, mode="drop").start()
    try:
        through_proxy = url.set(host="127.0.0.1", port=proxy.port)
        harness.configure(
            database_url=through_proxy.render_as_string(hide_password=False),
            journal_timeout_seconds="2",
        )
        # A client that gives up long after the intake should have answered: a hang fails.
        client = harness.start_intake()
        client.timeout = httpx.Timeout(20)
        assert client.post("/v1/order", json={"business_no": "BH-0"}).status_code == 202

        proxy.blackhole()
        answers = [
            client.post(
                "/v1/order", json={"business_no": f"BH-{n}"}, headers={"x-nonce": f"bh-{n}"}
            )
            for n in range(1, 4)
        ]
        assert [a.status_code for a in answers] == [503, 503, 503], [a.text for a in answers]
        assert {a.json()["error"]["code"] for a in answers} == {"journal_unavailable"}

        proxy.heal()

        def accepted_again() -> bool:
            body = {"business_no": "BH-1"}
            response = client.post("/v1/order", json=body, headers={"x-nonce": "bh-1"})
            return response.status_code in (200, 202)

        wait_for(accepted_again, timeout_s=60, what="the intake to accept again")
        # The refused requests, sent again with their nonces, are each stored once.
        for n in (2, 3):
            body = {"business_no": f"BH-{n}"}
            response = client.post("/v1/order", json=body, headers={"x-nonce": f"bh-{n}"})
            assert response.status_code in (200, 202), response.text
        stored = [r.business_no for r in harness.records()]
        assert sorted(stored) == ["BH-0", "BH-1", "BH-2", "BH-3"]
    finally:
        proxy.stop()
