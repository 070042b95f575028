"""Hostile requests at the socket level, against `pipeline intake` as it is deployed (its
uvicorn limits included): headers with CR, headers without end or sent too slowly, a
Content-Length that lies, a client sending a byte a second; and signatures and nonces that
must not work. (More requests in flight than allowed: tests/integration/test_hostile_clients.py.)"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest

from tests.support.harness import signed_headers
from tests.support.messages import empty_queue
from tests.support.processes import TLS_CONTEXT, free_port, wait_for
from tests.support.raw_http import read_answer, status_of

# HTTP, Redis or the browser: the journal's database plays no part.
pytestmark = pytest.mark.journal_independent

KEY_ID, SECRET = "shop-1", "s3cret-value-of-shop-1"
OTHER_ID, OTHER_SECRET = "shop-2", "other-s3cret-of-shop-2"
# The intake's header timeout in these tests (the setting's default is 10 s).
HEADER_TIMEOUT_S = 2
BODY = b'{"business_no": "A-1"}'


def raw(port: int, data: bytes, *, timeout_s: float = 10) -> bytes:
    """Send `data` on a new connection; everything the server answers until it closes or
    goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        return read_answer(sock)


def json_error(answer: bytes) -> dict:
    return json.loads(answer.partition(b"\r\n\r\n")[2])["error"]


def request_head(headers: dict[str, str], *, length: int, line: str = "order") -> bytes:
    lines = [f"POST /v1/{line} HTTP/1.1", "Host: intake", f"Content-Length: {length}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@dataclass(frozen=True)
class IntakeProcess:
    port: int
    pid: int


@pytest.fixture
def intake_process(harness):
    """`pipeline intake` in its own process, signed mode, small limits."""
    port = free_port()
    harness.configure(
        intake_keys=json.dumps({KEY_ID: SECRET, OTHER_ID: OTHER_SECRET}),
        admin_token="admin-token-of-hostile-input",
        intake_port=str(port),
        intake_body_timeout_seconds="1",
        intake_header_timeout_seconds=str(HEADER_TIMEOUT_S),
        intake_max_concurrent_requests="2",
    )
    process = harness.run("intake")

    def healthy() -> bool:
        assert process.process is not None
        assert process.process.poll() is None, process.output()
        try:
            return (
                httpx.get(
                    f"http://127.0.0.1:{port}/healthz", timeout=1, verify=TLS_CONTEXT
                ).status_code
                == 200
            )
        except httpx.HTTPError:
            return False

    wait_for(healthy, timeout_s=30, what="pipeline intake to answer")
    return IntakeProcess(port=port, pid=process.pid)


@pytest.fixture
def intake(intake_process):
    """The port of `intake_process`."""
    return intake_process.port


def test_a_header_value_with_a_carriage_return_is_refused(harness, intake):
    headers = signed_headers(KEY_ID, SECRET, BODY)
    headers["x-nonce"] = "abc\rX-Injected: 1"
    answer = raw(intake, request_head(headers, length=len(BODY)) + BODY)
    assert status_of(answer) == 400
    assert harness.record_count() == 0


def test_headers_past_the_parsers_limit_are_refused(harness, intake):
    headers = signed_headers(KEY_ID, SECRET, BODY)
    headers["x-padding"] = "a" * (100 * 1024)
    answer = raw(intake, request_head(headers, length=len(BODY)) + BODY)
    assert status_of(answer) == 431
    assert json_error(answer)["code"] == "headers_too_large"
    many = {f"x-h{n}": "1" for n in range(150)} | signed_headers(KEY_ID, SECRET, BODY)
    answer = raw(intake, request_head(many, length=len(BODY)) + BODY)
    assert status_of(answer) == 431
    assert harness.record_count() == 0


# Each flooding connection sends at most this much, for at most this long: far past any
# header limit, and bounded so that the test ends whatever the server does.
FLOOD_BYTES = 256 * 1024 * 1024
FLOOD_FOR_S = 6
FLOOD_CHUNK = b"a" * (256 * 1024)
FLOODERS = 5
# What the intake process may hold in resident memory while five connections each send it
# a header of hundreds of MiB: it serves in well under 150 MiB (the journal, FastAPI and
# SQLAlchemy included); a parser that buffers the floods needs several times this.
RSS_BOUND_BYTES = 256 * 1024 * 1024


def rss_bytes(pid: int) -> int:
    """The resident memory of process `pid` (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"process {pid} has no VmRSS")


def flood_one_header(port: int) -> tuple[int, bool]:
    """Open a request and send one header value without end, in chunks, until the server
    closes the connection or the budget (`FLOOD_BYTES`, `FLOOD_FOR_S`) is spent. Returns
    the bytes sent and whether the server closed the connection."""
    sent = 0
    deadline = time.monotonic() + FLOOD_FOR_S
    with socket.create_connection(("127.0.0.1", port), timeout=FLOOD_FOR_S) as sock:
        try:
            sock.sendall(b"POST /v1/order HTTP/1.1\r\nHost: intake\r\nX-Flood: ")
            while sent < FLOOD_BYTES and time.monotonic() < deadline:
                sock.sendall(FLOOD_CHUNK)
                sent += len(FLOOD_CHUNK)
        except TimeoutError:
            pass  # the server stopped reading without closing: seen below
        except OSError:
            return sent, True  # reset or broken pipe: the server closed it
        sock.settimeout(2)
        try:
            while True:  # whatever it answered (a 431), then the end of the connection
                if not sock.recv(65536):
                    return sent, True
        except TimeoutError:
            return sent, False
        except OSError:
            return sent, True


def test_headers_without_end_are_cut_off_while_read_and_others_are_served(harness, intake_process):
    port, pid = intake_process.port, intake_process.pid
    results: list[tuple[int, bool]] = []
    threads = [
        threading.Thread(target=lambda: results.append(flood_one_header(port)), daemon=True)
        for _ in range(FLOODERS)
    ]
    peak = rss_bytes(pid)
    for thread in threads:
        thread.start()
    body = b'{"business_no": "DURING-FLOOD"}'
    try:
        served = httpx.post(
            f"http://127.0.0.1:{port}/v1/order",
            content=body,
            headers=signed_headers(KEY_ID, SECRET, body),
            timeout=FLOOD_FOR_S + 5,
        ).status_code
    except httpx.HTTPError as exc:
        served = repr(exc)
    while any(thread.is_alive() for thread in threads):
        peak = max(peak, rss_bytes(pid))
        time.sleep(0.05)  # sampling the memory while the floods run
        for thread in threads:
            thread.join(timeout=0)
    for thread in threads:
        thread.join(timeout=FLOOD_FOR_S + 10)
    peak = max(peak, rss_bytes(pid))
    assert peak < RSS_BOUND_BYTES, f"the intake held {peak / 2**20:.0f} MiB"
    assert served == 202
    assert len(results) == FLOODERS
    assert all(closed for _sent, closed in results), results
    assert [r.business_no for r in harness.records()] == ["DURING-FLOOD"]


def test_several_intake_processes_cut_headers_off_while_read_too(harness):
    port = free_port()
    harness.configure(
        intake_keys=json.dumps({KEY_ID: SECRET}), intake_port=str(port), intake_workers="2"
    )
    process = harness.run("intake")

    def healthy() -> bool:
        assert process.process is not None
        assert process.process.poll() is None, process.output()
        try:
            return (
                httpx.get(
                    f"http://127.0.0.1:{port}/healthz", timeout=1, verify=TLS_CONTEXT
                ).status_code
                == 200
            )
        except httpx.HTTPError:
            return False

    wait_for(healthy, timeout_s=30, what="two intake processes to answer")
    # A header that never ends: only a limit applied while reading answers it.
    answer = raw(port, b"POST /v1/order HTTP/1.1\r\nHost: intake\r\nX-Flood: " + b"a" * 2**16)
    assert status_of(answer) == 431
    assert json_error(answer)["code"] == "headers_too_large"
    _sent, closed = flood_one_header(port)
    assert closed


def test_requests_one_after_another_and_pipelined_on_one_connection_are_all_answered(intake):
    """The header limit counts each request's headers afresh: a connection may carry many."""

    def signed(n: int) -> bytes:
        body = b'{"business_no": "KEPT-%d"}' % n
        return request_head(signed_headers(KEY_ID, SECRET, body), length=len(body)) + body

    def statuses(answers: BinaryIO, count: int) -> list[int]:
        found = []
        for _ in range(count):
            found.append(status_of(answers.readline()))
            length = 0
            while (line := answers.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            answers.read(length)
        return found

    with (
        socket.create_connection(("127.0.0.1", intake), timeout=10) as sock,
        sock.makefile("rb") as answers,
    ):
        for n in range(3):
            sock.sendall(signed(n))
            assert statuses(answers, 1) == [202]
        sock.sendall(signed(3) + signed(4))  # two requests in one write
        assert statuses(answers, 2) == [202, 202]


def test_a_request_whose_headers_never_end_is_closed_after_the_header_timeout(intake):
    with socket.create_connection(("127.0.0.1", intake), timeout=10) as sock:
        sock.sendall(b"POST /v1/order HTTP/1.1\r\nHost: intake\r\nX-Slow: ")
        started = time.monotonic()
        answer = b""
        # A byte now and then, never the end of the headers, until the server closes the
        # connection or three header timeouts have passed.
        while time.monotonic() - started < 3 * HEADER_TIMEOUT_S:
            try:
                sock.sendall(b"a")
            except OSError:
                break
            if select.select([sock], [], [], 0.25)[0]:
                chunk = sock.recv(65536)
                answer += chunk
                if not chunk:
                    break
        else:
            raise AssertionError(f"still open after {3 * HEADER_TIMEOUT_S} s: {answer!r}")
    assert answer == b"" or status_of(answer) == 408, answer


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(intake):
    with socket.create_connection(("127.0.0.1", intake), timeout=3 * HEADER_TIMEOUT_S) as sock:
        try:
            answer = sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"still open after {3 * HEADER_TIMEOUT_S} s") from None
        while answer and (more := sock.recv(65536)):
            answer += more
    assert answer == b"" or status_of(answer) == 408, answer


def test_a_content_length_longer_than_the_body_gets_408_once_the_timeout_passes(harness, intake):
    head = request_head(signed_headers(KEY_ID, SECRET, BODY), length=len(BODY) + 50)
    started = time.monotonic()
    answer = raw(intake, head + BODY)
    assert status_of(answer) == 408
    assert json_error(answer)["code"] == "request_timeout"
    assert time.monotonic() - started < 5
    assert harness.record_count() == 0


def test_a_content_length_shorter_than_the_body_is_refused(harness, intake):
    head = request_head(signed_headers(KEY_ID, SECRET, BODY), length=len(BODY) - 5)
    answer = raw(intake, head + BODY)
    # The bytes past the declared length are a malformed next request (400), or the
    # truncated body fails its signature (401): refused either way, nothing stored.
    assert status_of(answer) in (400, 401)
    assert harness.record_count() == 0


def test_a_chunked_body_past_the_limit_gets_413(harness, intake):
    head = (
        b"POST /v1/order HTTP/1.1\r\nHost: intake\r\nTransfer-Encoding: chunked\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in signed_headers(KEY_ID, SECRET, b"").items()).encode()
        + b"\r\n"
    )
    chunk = b"x" * 65536
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(20))
    answer = raw(intake, head + chunks + b"0\r\n\r\n")
    assert status_of(answer) == 413
    assert json_error(answer)["code"] == "payload_too_large"
    assert harness.record_count() == 0


def test_a_transfer_encoding_other_than_chunked_is_refused(harness, intake):
    head = (
        b"POST /v1/order HTTP/1.1\r\nHost: intake\r\nTransfer-Encoding: gzip\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in signed_headers(KEY_ID, SECRET, BODY).items()).encode()
        + b"\r\n"
    )
    answer = raw(intake, head + BODY)
    # No framing the server can read: refused (by the HTTP parser, in plain text) before any
    # body is taken, the connection closed, nothing stored.
    assert status_of(answer) == 400, answer[:300]
    assert b"connection: close" in answer.lower()
    assert harness.record_count() == 0


def test_a_client_sending_a_byte_a_second_is_cut_off_and_others_are_served(harness, intake):
    head = request_head(signed_headers(KEY_ID, SECRET, BODY), length=len(BODY))
    answers: list[bytes] = []
    sending = threading.Event()

    def slow() -> None:
        with socket.create_connection(("127.0.0.1", intake), timeout=10) as sock:
            sock.sendall(head)
            try:
                for byte in BODY:
                    if select.select([sock], [], [], 0)[0]:
                        break  # the server answered before the body ended: read it below
                    sock.sendall(bytes([byte]))
                    sending.set()
                    time.sleep(1)  # a byte a second: the slowness under test, not a wait
            except OSError:
                pass  # the server gave up on us: what it answered is below
            answers.append(read_answer(sock))

    thread = threading.Thread(target=slow, daemon=True)
    thread.start()
    wait_for(sending.is_set, timeout_s=10, what="the slow client to send its body")
    body = b'{"business_no": "FAST-1"}'
    fast = httpx.post(
        f"http://127.0.0.1:{intake}/v1/order",
        content=body,
        headers=signed_headers(KEY_ID, SECRET, body),
        timeout=5,
    )
    assert fast.status_code == 202
    thread.join(timeout=30)
    assert answers, "the slow client got no answer"
    assert status_of(answers[0]) == 408
    assert [r.business_no for r in harness.records()] == ["FAST-1"]


def test_a_signature_made_with_another_keys_secret_tells_nothing_more(harness, intake):
    url = f"http://127.0.0.1:{intake}/v1/order"
    other = httpx.post(url, content=BODY, headers=signed_headers(KEY_ID, OTHER_SECRET, BODY))
    unknown = httpx.post(url, content=BODY, headers=signed_headers("shop-9", SECRET, BODY))
    forged = signed_headers(KEY_ID, SECRET, BODY)
    forged["x-signature"] = "f" * 64
    bad = httpx.post(url, content=BODY, headers=forged)
    # The same answer whether the key is unknown, the secret another key's, or the
    # signature garbage: a client learns nothing about which keys exist.
    assert other.status_code == unknown.status_code == bad.status_code == 401
    assert other.json() == unknown.json() == bad.json()
    assert harness.record_count() == 0


def test_the_nonce_is_remembered_across_an_intake_restart(harness):
    harness.configure(intake_keys=json.dumps({KEY_ID: SECRET}))
    first = harness.start_intake()
    headers = signed_headers(KEY_ID, SECRET, BODY, nonce="nonce-restart")
    created = first.post("/v1/order", content=BODY, headers=headers)
    assert created.status_code == 202
    harness.intakes[0].stop()

    second = harness.start_intake()
    again = second.post("/v1/order", content=BODY, headers=headers)
    assert again.status_code == 200
    assert again.json()["id"] == created.json()["id"]
    other = b'{"business_no": "A-2"}'
    reused = second.post(
        "/v1/order",
        content=other,
        headers=signed_headers(KEY_ID, SECRET, other, nonce="nonce-restart"),
    )
    assert reused.status_code == 409
    assert reused.json()["error"]["code"] == "nonce_reused"
    assert harness.record_count() == 1


def test_a_known_nonce_sent_to_another_line_is_a_conflict(harness):
    harness.configure(intake_keys=json.dumps({KEY_ID: SECRET}))
    client = harness.start_intake()
    headers = signed_headers(KEY_ID, SECRET, BODY, nonce="nonce-of-an-order")
    created = client.post("/v1/order", content=BODY, headers=headers)
    assert created.status_code == 202
    elsewhere = client.post("/v1/refund", content=BODY, headers=headers)
    assert elsewhere.status_code == 409, elsewhere.text
    assert elsewhere.json()["error"]["code"] == "nonce_reused"
    assert "id" not in elsewhere.json()  # nothing of the other line's record
    assert [(r.line, r.id) for r in harness.records()] == [("order", created.json()["id"])]


def test_a_rejected_records_nonce_sent_to_another_line_does_not_admit_it_again(harness):
    harness.configure(
        intake_keys=json.dumps({KEY_ID: SECRET}),
        lines__order__overflow="reject",
        lines__order__max_queue_length="1",
    )
    client = harness.start_intake()
    first = b'{"business_no": "FIRST"}'
    assert client.post("/v1/order", content=first, headers=signed_headers(KEY_ID, SECRET, first))
    headers = signed_headers(KEY_ID, SECRET, BODY, nonce="nonce-rejected")
    rejected = client.post("/v1/order", content=BODY, headers=headers)
    assert rejected.status_code == 429
    empty_queue(harness.runtime().redis, "order")  # room on the order queue again
    elsewhere = client.post("/v1/refund", content=BODY, headers=headers)
    assert elsewhere.status_code == 409, elsewhere.text
    kept = {r.id: r for r in harness.records()}[rejected.json()["id"]]
    assert (kept.line, kept.status.value) == ("order", "rejected")
