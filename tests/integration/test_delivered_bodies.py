"""The body of a delivered answer: nothing uses it, so the HTTP sink reads it only up to
64 KiB (`MAX_DELIVERED_BYTES`) and closes a connection whose body runs longer, rather
than read it (a downstream that sends megabytes with its 2xx costs no more than one that
sends nothing); a short body is read whole and its connection kept for the next
delivery."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from dataclasses import dataclass, field

import pytest

from app.journal.models import RecordStatus
from tests.support.harness import Harness
from tests.support.journal import journal_records
from tests.support.processes import wait_for

# What it checks is the engine's and Redis's, not the journal's database: the SQLite pass only.
pytestmark = pytest.mark.journal_independent

LINE = "shipment"
# What the sink reads of a delivered answer's body at most (`MAX_DELIVERED_BYTES` of
# app.delivery.sinks, written out: the test also runs against a sink without it).
READ_BOUND = 64 * 1024
# Far more than the socket buffers between the downstream and the worker hold (a few MB on
# loopback): a client that stops reading after 64 KiB and closes leaves most of it unsent.
HUGE_BODY = 128 * 1024 * 1024
SMALL_BODY = 100
CHUNK = 64 * 1024
# A delivery's deadline: reading the whole huge body on loopback (what the sink did before)
# takes well under it, so that such a sink fails this test for the bytes it read, not for a
# timeout.
DELIVERY_TIMEOUT_S = 30
# How long a connection of the downstream waits on a client that neither reads nor closes.
STALL_S = 30.0


@dataclass
class Connection:
    """One connection the downstream accepted: the Idempotency-Keys of its requests, in
    order, the body bytes it managed to send (of all its answers), and whether the client
    closed it while an answer's body was still being sent."""

    keys: list[str] = field(default_factory=list)
    body_bytes_sent: int = 0
    cut_short: bool = False


class BigBodies:
    """A raw HTTP/1.1 downstream on 127.0.0.1: answers each POST 200, with a body of
    `HUGE_BODY` bytes for the records in `huge` (sent in chunks as fast as the client
    takes them) and of `SMALL_BODY` bytes for the others, and keeps the connection for the
    next request. Counts the connections and what it sent on each."""

    def __init__(self) -> None:
        self.huge: set[str] = set()
        self.connections: list[Connection] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=16)
        self._thread = threading.Thread(target=self._accept, name="big-bodies", daemon=True)
        self._open: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}/in"

    def start(self) -> BigBodies:
        self._thread.start()
        return self

    def stop(self) -> None:
        # Shut down first: a socket closed from another thread does not wake its accept
        # or recv.
        with self._lock:
            sockets = [self._listener, *self._open]
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=10)

    def snapshot(self) -> list[Connection]:
        with self._lock:
            return list(self.connections)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            connection = Connection()
            with self._lock:
                self.connections.append(connection)
                self._open.append(sock)
            threading.Thread(target=self._serve, args=(sock, connection), daemon=True).start()

    def _serve(self, sock: socket.socket, connection: Connection) -> None:
        sock.settimeout(STALL_S)
        pending = b""
        try:
            while True:
                try:
                    request, pending = _read_request(sock, pending)
                except TimeoutError:
                    return  # a kept connection the client left idle
                if request is None:
                    return  # the client closed it between requests
                key = request
                with self._lock:
                    connection.keys.append(key)
                    size = HUGE_BODY if key in self.huge else SMALL_BODY
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode()
                sock.sendall(head)
                if not self._send_body(sock, connection, size):
                    return
        except Exception as exc:  # noqa: BLE001 - reported by the test, not by a thread
            with self._lock:
                self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            sock.close()

    def _send_body(self, sock: socket.socket, connection: Connection, size: int) -> bool:
        """Send `size` bytes; False when the client closed the connection first."""
        chunk, sent = b"x" * CHUNK, 0
        while sent < size:
            part = chunk[: size - sent]
            try:
                sock.sendall(part)
            except (BrokenPipeError, ConnectionResetError):
                connection.cut_short = True
                return False
            sent += len(part)
            connection.body_bytes_sent += len(part)
        return True


def _read_request(sock: socket.socket, pending: bytes) -> tuple[str | None, bytes]:
    """The next request's Idempotency-Key (None: the client closed the connection), and
    what was read past its end."""
    data = pending
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        rest += chunk
    body, rest = rest[:length], rest[length:]
    key = headers.get("idempotency-key") or str(json.loads(body)["id"])
    return key, rest


def test_a_huge_delivered_answer_is_read_only_up_to_its_bound_and_its_connection_closed(
    harness: Harness,
) -> None:
    """Three records delivered one after another by the engine (in-process), to a
    downstream that answers the first 200 with a 128 MB body and the others 200 with a
    100-byte one. The first is `done`, and the downstream saw its connection closed after a
    small part of that body (what the sink read, 64 KiB, and the socket buffers between
    them), not the whole; the second goes on a new connection, and the third on that same
    connection: a short body is read whole and its connection kept."""
    downstream = BigBodies().start()
    try:
        harness.configure(
            **{
                f"lines__{LINE}__downstream_url": downstream.url,
                f"lines__{LINE}__delivery_timeout_s": str(DELIVERY_TIMEOUT_S),
            }
        )
        rt = harness.runtime()
        line = rt.lines.get(LINE)
        payloads = [{"business_no": f"BODY-{n}"} for n in range(3)]
        huge, small, again = journal_records(rt, payloads, line=LINE, status=RecordStatus.ENQUEUED)
        downstream.huge.add(huge)

        statuses = []
        for record_id in (huge, small, again):
            (result,) = rt.attempts.run([record_id], line=line)
            statuses.append(result.status)
        assert statuses == [RecordStatus.DONE] * 3

        connections = downstream.snapshot()
        seen = [
            f"connection {n}: {len(c.keys)} requests, {c.body_bytes_sent} body bytes sent"
            + (", closed by the client mid-body" if c.cut_short else "")
            for n, c in enumerate(connections, 1)
        ]
        first, *others = connections
        wait_for(
            lambda: first.cut_short or first.body_bytes_sent >= HUGE_BODY,
            timeout_s=STALL_S,
            what="the huge body sent or cut short",
        )
        assert downstream.errors == []
        # The client closed the connection with most of the body unsent: it read its 64 KiB
        # and left the rest in the socket buffers (a few MB at most), not 128 MB.
        assert first.cut_short, f"the whole huge body was read: {seen}"
        assert READ_BOUND < first.body_bytes_sent < HUGE_BODY // 4, seen
        # The next delivery went on a new connection, and the one after it on that one.
        assert first.keys == [huge], seen
        assert [connection.keys for connection in others] == [[small, again]], seen
        assert not others[0].cut_short
    finally:
        downstream.stop()
