"""A delivery has one deadline: `DELIVERY_TIMEOUT_S` bounds its request from connect to
last byte, whatever the downstream trickles. A downstream that sends its answer's head a
byte every 2 s never has two requests of one record open at once (the first outlived its
lease, and the record was taken again), and a cancel while a request is open is refused."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections import Counter

import pytest

from tests.support.processes import wait_for

pytestmark = [pytest.mark.journal_independent, pytest.mark.long]

TRICKLE_S = 60
BYTE_EVERY_S = 2
WATCH_S = 40


class Trickler:
    """A downstream on 127.0.0.1 that reads each request whole, then answers its head one
    byte every `BYTE_EVERY_S`, for `TRICKLE_S` at most; it keeps how many requests of each
    Idempotency-Key are open, and the most ever open at once."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.lock = threading.Lock()
        self.open: Counter[str] = Counter()
        self.most_open: Counter[str] = Counter()
        self.requests = 0
        self.stopping = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/in"

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            headers = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
            }
            length = int(headers.get(b"content-length", b"0"))
            while len(body) < length:
                body += conn.recv(65536)
            key = headers.get(b"idempotency-key", b"").decode()
            with self.lock:
                self.requests += 1
                self.open[key] += 1
                self.most_open[key] = max(self.most_open[key], self.open[key])
            try:
                self._trickle(conn)
            except OSError:
                pass  # the client gave up on us
            finally:
                with self.lock:
                    self.open[key] -= 1

    def _trickle(self, conn: socket.socket) -> None:
        began = time.monotonic()
        for byte in b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n":
            if self.stopping.is_set() or time.monotonic() - began > TRICKLE_S:
                return
            conn.sendall(bytes([byte]))
            # The trickle under test; a client that closes ends it at once.
            if select.select([conn], [], [], BYTE_EVERY_S)[0] and not conn.recv(1):
                return

    def any_open(self) -> bool:
        with self.lock:
            return any(n > 0 for n in self.open.values())

    def stop(self) -> None:
        self.stopping.set()
        self.sock.close()


def test_a_trickling_downstream_never_has_one_record_open_twice_and_a_cancel_waits(harness):
    downstream = Trickler()
    try:
        harness.configure(
            lines__shipment__downstream_url=downstream.url,
            lines__shipment__delivery_timeout_s="3",
            lines__shipment__backoff_initial_s="0.5",
            lines__shipment__backoff_max_s="1",
            lines__shipment__circuit_min_attempts="1000",
            visibility_timeout_seconds="20",
            sweep_interval_seconds="0.5",
        )
        client = harness.start_intake()
        harness.start_worker("shipment", pool=None, concurrency=None)
        harness.start_beat()
        record_id = client.post("/v1/shipment", json={"business_no": "TRICKLED"}).json()["id"]
        wait_for(downstream.any_open, timeout_s=30, what="the first request")
        began = time.monotonic()
        cancels: list[int] = []
        while time.monotonic() - began < WATCH_S:
            if downstream.any_open():
                answer = client.post(f"/v1/records/{record_id}/cancel", json={"reason": "t"})
                if downstream.any_open():  # still open after the answer: it was open at it
                    cancels.append(answer.status_code)
                elif answer.status_code == 200:
                    break  # cancelled between two attempts, as it may be: nothing more comes
            time.sleep(1)  # a sample a second: the trickle takes its time
        assert downstream.most_open[record_id] == 1, dict(downstream.most_open)
        assert cancels, "no cancel was made while a request was open"
        assert set(cancels) == {409}, cancels
    finally:
        downstream.stop()
