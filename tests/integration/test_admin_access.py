"""Admin access explains itself: with intake keys and no admin token, `pipeline intake` says
at start that the admin endpoints are closed and how to open them, and they answer 401
saying so, whatever is sent; with a token configured, none sent is 401 and a wrong one 403."""

from __future__ import annotations

import json

import httpx

from tests.support.processes import TLS_CONTEXT, free_port, wait_for

KEY_ID, SECRET = "shop-1", "s3cret-value-of-shop-1"
ADMIN_PATHS = ("/v1/records", "/v1/audit")


def test_with_keys_and_no_admin_token_the_intake_says_at_start_how_to_open_the_admin_endpoints(
    harness,
):
    harness.configure(intake_keys=json.dumps({KEY_ID: SECRET}))
    port = free_port()
    intake = harness.run("intake", "--port", str(port))
    intake.wait_for_output("admin_endpoints_closed", timeout_s=30)
    assert "PIPELINE_ADMIN_TOKEN" in intake.output()
    base = f"http://127.0.0.1:{port}"

    def listening() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=2, verify=TLS_CONTEXT).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(listening, timeout_s=30, what="the intake to listen")
    for path in ADMIN_PATHS:
        for headers in ({}, {"authorization": "Bearer anything"}):
            answer = httpx.get(f"{base}{path}", headers=headers, timeout=10)
            assert answer.status_code == 401
            error = answer.json()["error"]
            assert error["code"] == "admin_not_configured"
            assert "no admin token is configured" in error["message"].lower()
            assert "PIPELINE_ADMIN_TOKENS" in error["message"]
    replay = httpx.post(f"{base}/v1/replay", json={"dry_run": True}, timeout=10)
    assert replay.json()["error"]["code"] == "admin_not_configured"


def test_with_a_token_configured_none_sent_is_401_asking_for_it_and_a_wrong_one_403(harness):
    harness.configure(
        intake_keys=json.dumps({KEY_ID: SECRET}),
        admin_tokens=json.dumps({"alice": "alice-token-0123456789"}),
    )
    client = harness.start_intake()
    missing = client.get("/v1/audit")
    assert (missing.status_code, missing.json()["error"]["code"]) == (401, "admin_required")
    assert "bearer token is required" in missing.json()["error"]["message"].lower()
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = client.get("/v1/audit", headers={"authorization": "Bearer nope"})
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (403, "admin_forbidden")
    good = client.get("/v1/audit", headers={"authorization": "Bearer alice-token-0123456789"})
    assert good.json() == {"items": [], "next": None}
