"""Hostile clients cannot take the intake from the sources that sign their pushes: slow or
huge bodies without credentials take no room and are refused before they are read (admin
routes check the token first); a page of another site cannot act on the intake, in dev
mode either; the alert history is for admins; a slow `caller_runs` line keeps to its share
of the intake."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from tests.support.downstream import Gauged
from tests.support.harness import signed_headers
from tests.support.processes import TLS_CONTEXT, free_port, wait_for
from tests.support.raw_http import read_answer, status_of

# HTTP and the intake's own limits: the journal's database plays no part.
pytestmark = pytest.mark.journal_independent

KEY_ID, SECRET = "shop-1", "s3cret-value-of-shop-1"
ADMIN_TOKEN = "admin-token-of-hostile-clients"
IN_FLIGHT = 4
BODY_TIMEOUT_S = 10
MIB = 1024 * 1024


@dataclass(frozen=True)
class Intake:
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def push(self, business_no: str, *, line: str = "order") -> httpx.Response:
        body = json.dumps({"business_no": business_no}).encode()
        return httpx.post(
            f"{self.url}/v1/{line}",
            content=body,
            headers=signed_headers(KEY_ID, SECRET, body),
            timeout=10,
        )


@pytest.fixture
def intake(harness) -> Intake:
    """`pipeline intake` as deployed (its own process and HTTP protocol), signed, with an
    admin token, `IN_FLIGHT` requests in flight at most."""
    port = free_port()
    harness.configure(
        intake_keys=json.dumps({KEY_ID: SECRET}),
        admin_token=ADMIN_TOKEN,
        intake_port=str(port),
        intake_body_timeout_seconds=str(BODY_TIMEOUT_S),
        intake_max_concurrent_requests=str(IN_FLIGHT),
    )
    process = harness.run("intake")

    def healthy() -> bool:
        assert process.process is not None
        assert process.process.poll() is None, process.output()
        try:
            answer = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1, verify=TLS_CONTEXT)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    wait_for(healthy, timeout_s=30, what="pipeline intake to answer")
    return Intake(port=port)


def head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: intake", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def trickle(port: int, path: str, headers: dict[str, str]) -> socket.socket:
    """A connection that declares a 1,000-byte body and sends 10 bytes of it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(head(path, {**headers, "Content-Length": "1000"}) + b'{"dry_run"')
    return sock


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1/replay", {"Content-Type": "application/json"}),
        ("/v1/order", {"Content-Type": "application/json"}),
    ],
    ids=["admin-without-token", "push-without-signature"],
)
def test_trickling_bodies_without_credentials_leave_room_for_a_signed_push(
    harness, intake, path, headers
):
    held = [trickle(intake.port, path, headers) for _ in range(IN_FLIGHT)]
    try:
        # The trickles reach the intake before the push does: the order under test.
        time.sleep(0.5)
        started = time.monotonic()
        answer = intake.push("SIGNED-1")
        assert answer.status_code == 202, answer.text
        assert time.monotonic() - started < 2
        if path == "/v1/replay":
            # The token is checked before the body is read: refused at once.
            assert [status_of(read_answer(sock, timeout_s=5)) for sock in held] == [401] * IN_FLIGHT
        else:
            # A push's signature covers its body: it waits for it, then for its time limit.
            answers = [read_answer(sock, timeout_s=BODY_TIMEOUT_S + 10) for sock in held]
            assert [status_of(a) for a in answers] == [408] * IN_FLIGHT
    finally:
        for sock in held:
            sock.close()
    assert [r.business_no for r in harness.records()] == ["SIGNED-1"]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_50_mib_body_without_a_token_is_refused_before_it_is_read(intake, framing):
    length = {"Content-Length": str(50 * MIB)} if framing == "content-length" else {}
    chunked = {"Transfer-Encoding": "chunked"} if framing == "chunked" else {}
    first = b"x" * 65536
    with socket.create_connection(("127.0.0.1", intake.port), timeout=10) as sock:
        sock.sendall(head("/v1/replay", {"Content-Type": "application/json", **length, **chunked}))
        sock.sendall(b"%x\r\n%s\r\n" % (len(first), first) if chunked else first)
        # 64 KiB of 50 MiB sent: the answer comes now, not after the rest.
        answer = read_answer(sock, timeout_s=5)
    assert status_of(answer) == 401
    # The token's refusal (admin_required: the only one that asks for a bearer token), read
    # from the head: the body may be lost to the reset of a connection closed unread.
    assert b"www-authenticate: bearer" in answer.lower()


def test_a_50_mib_push_is_refused_413_before_it_is_read(harness, intake):
    with socket.create_connection(("127.0.0.1", intake.port), timeout=10) as sock:
        headers = signed_headers(KEY_ID, SECRET, b"{}")
        sock.sendall(head("/v1/order", {**headers, "Content-Length": str(50 * MIB)}))
        sock.sendall(b"x" * 65536)
        answer = read_answer(sock, timeout_s=5)
    assert status_of(answer) == 413
    assert harness.record_count() == 0


def test_the_alert_history_takes_the_admin_token(intake):
    missing = httpx.get(f"{intake.url}/v1/alerts", timeout=10)
    assert (missing.status_code, missing.json()["error"]["code"]) == (401, "admin_required")
    wrong = httpx.get(f"{intake.url}/v1/alerts", headers={"authorization": "Bearer no"}, timeout=10)
    assert wrong.status_code == 403
    good = httpx.get(
        f"{intake.url}/v1/alerts", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10
    )
    assert good.status_code == 200
    assert "alerts" in good.json()
    # What the intake shows without a token: counts and health.
    for path in ("/v1/lines", "/v1/health", "/metrics", "/readyz"):
        assert httpx.get(f"{intake.url}{path}", timeout=10).status_code == 200, path


def paused(client: httpx.Client, line: str) -> bool:
    rows = client.get("/v1/lines").json()["lines"]
    return next(row for row in rows if row["line"] == line)["paused"]


@pytest.mark.parametrize(
    "browser_says",
    [
        {"origin": "http://127.0.0.1:9999"},
        {"origin": "http://localhost:8000"},
        {"origin": "null"},
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},
    ],
    ids=["other-port", "other-name", "null", "cross-site", "same-site"],
)
def test_a_page_of_another_site_cannot_act_in_dev_mode(harness, browser_says):
    client = harness.start_intake()  # dev mode: unsigned, admin open
    pause = client.post("/v1/lines/order/pause", headers=browser_says)
    assert pause.status_code == 403, pause.text
    assert pause.json()["error"]["code"] == "cross_site_request"
    assert not paused(client, "order")
    push = client.post("/v1/order", json={"business_no": "FROM-A-PAGE"}, headers=browser_says)
    assert push.status_code == 403
    assert harness.record_count() == 0


def test_the_intakes_own_page_and_clients_without_origin_act_as_before(harness):
    client = harness.start_intake()
    own = {"origin": str(client.base_url).rstrip("/"), "sec-fetch-site": "same-origin"}
    assert client.post("/v1/lines/order/pause", json={"reason": "own page"}, headers=own).is_success
    assert paused(client, "order")
    assert client.post("/v1/lines/order/resume").is_success  # curl: no Origin
    assert not paused(client, "order")
    assert client.post("/v1/order", json={"business_no": "CURL-1"}).status_code == 202


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
def test_a_body_that_is_not_json_is_refused_415(harness, content_type):
    client = harness.start_intake()
    body = b'{"business_no": "FORM-1"}'
    push = client.post("/v1/order", content=body, headers={"content-type": content_type})
    assert push.status_code == 415, push.text
    assert push.json()["error"]["code"] == "unsupported_media_type"
    pause = client.post(
        "/v1/lines/order/pause", content=b"{}", headers={"content-type": content_type}
    )
    assert pause.status_code == 415
    assert not paused(client, "order")
    assert harness.record_count() == 0
    typed = client.post(
        "/v1/order", content=body, headers={"content-type": "application/json; charset=utf-8"}
    )
    assert typed.status_code == 202


def test_a_slow_caller_runs_line_keeps_to_its_share_and_other_lines_are_answered(harness):
    """64 status pushes, each run by the intake against a downstream that takes 3 s, beside
    10 order pushes: every order push is answered 202, and no status push 503. The intake
    takes 64 requests in flight: the status pushes alone would fill it."""
    downstream = Gauged(delay_s=3).start()
    try:
        harness.configure(
            intake_max_concurrent_requests="64",
            lines__status__overflow="caller_runs",
            lines__status__max_queue_length="1",
            lines__status__downstream_url=f"{downstream.url}/in",
        )
        client = harness.start_intake()
        first = {"business_no": "S-0", "status": "paid", "occurred_at": "2026-12-01T00:00:00Z"}
        assert client.post("/v1/status", json=first).json()["status"] == "enqueued"

        # A client per push: 74 threads on one client's pool once met a connection closed
        # under a reader (httpx ReadError, Errno 9), the pool's race, not the intake's.
        def post(path: str, body: dict[str, str]) -> httpx.Response:
            with httpx.Client(base_url=client.base_url, timeout=60) as own:
                return own.post(path, json=body)

        def status_push(n: int) -> httpx.Response:
            return post("/v1/status", {**first, "business_no": f"S-{n + 1}"})

        def order_push(n: int) -> httpx.Response:
            return post("/v1/order", {"business_no": f"O-{n}"})

        with ThreadPoolExecutor(max_workers=74) as pool:
            statuses = [pool.submit(status_push, n) for n in range(64)]
            wait_for(lambda: downstream.in_flight > 0, timeout_s=30, what="a status run")
            orders = [pool.submit(order_push, n) for n in range(10)]
            order_codes = [f.result(timeout=60).status_code for f in orders]
            status_answers = [f.result(timeout=60) for f in statuses]
        assert order_codes == [202] * 10
        assert {a.status_code for a in status_answers} <= {200, 202}, [
            a.text for a in status_answers if a.status_code not in (200, 202)
        ]
        # Past the line's share (a quarter of 64), a push is answered at once, its record
        # kept for the sweeper.
        waited = [a.json()["status"] for a in status_answers]
        assert waited.count("received") >= 32, waited
        assert harness.record_count() == 1 + 64 + 10
    finally:
        downstream.stop()


def test_requests_past_their_body_beyond_the_in_flight_limit_get_503_with_retry_after(harness):
    """Two pushes that the intake runs itself toward a downstream that holds them take both
    of two slots; a third request gets 503 at once, health checks are still answered."""
    downstream = Gauged(hold_s=30).start()
    downstream.hold_first = True
    try:
        harness.configure(intake_max_concurrent_requests="2")
        for line in ("order", "refund"):
            harness.configure(
                **{
                    f"lines__{line}__overflow": "caller_runs",
                    f"lines__{line}__max_queue_length": "1",
                    f"lines__{line}__downstream_url": f"{downstream.url}/in",
                }
            )
        client = harness.start_intake()
        for line in ("order", "refund"):
            queued = client.post(f"/v1/{line}", json={"business_no": "QUEUED"})
            assert queued.json()["status"] == "enqueued", queued.text

        def run_here(line: str) -> httpx.Response:
            body = {"business_no": f"HELD-{line}"}
            return client.post(f"/v1/{line}", json=body, timeout=60)

        with ThreadPoolExecutor(max_workers=2) as pool:
            held = [pool.submit(run_here, line) for line in ("order", "refund")]
            wait_for(lambda: downstream.in_flight == 2, timeout_s=30, what="both runs held")
            probe = client.get("/v1/lines")
            assert probe.status_code == 503
            assert probe.json()["error"]["code"] == "overloaded"
            assert probe.headers["retry-after"] == "1"
            assert client.get("/healthz").status_code == 200
            downstream.release()
            assert [f.result(timeout=60).status_code for f in held] == [200, 200]
        after = client.post("/v1/order", json={"business_no": "AFTER"})
        assert (after.status_code, after.json()["status"]) == (200, "done")
    finally:
        downstream.stop()
