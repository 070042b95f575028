"""A real HTTP server on 127.0.0.1 that records what it receives: the downstream double."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class LocalServer(ThreadingHTTPServer):
    """A threaded HTTP server whose listen backlog holds a burst of connections: the
    default (5) drops a burst's SYNs on a busy machine, and each dropped one arrives a
    second or more late, as the client's kernel sends it again."""

    request_queue_size = 128


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes = b""
    query: dict[str, str] = field(default_factory=dict)
    at_s: float = 0.0  # monotonic time of arrival
    answered: int = 0  # the status code the recorder answered with


@dataclass
class Recorder:
    """Requests received, and the status code to answer with (changeable at any time)."""

    status: int = 200
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Recorder:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(length)
                if len(raw) < length:
                    # The client went away mid-body (a worker killed while it posted): a
                    # real server would not act on half a request, and no one can read
                    # an answer.
                    self.close_connection = True
                    return
                url = urllib.parse.urlsplit(self.path)
                received = Received(
                    path=url.path,
                    headers=dict(self.headers.items()),
                    body=json.loads(raw or b"null"),
                    raw=raw,
                    query=dict(urllib.parse.parse_qsl(url.query)),
                    at_s=time.monotonic(),
                )
                with recorder.lock:
                    status = received.answered = recorder.status
                    recorder.received.append(received)
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                return

        self.server = LocalServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def snapshot(self) -> list[Received]:
        with self.lock:
            return list(self.received)


class SilentServer:
    """Accepts connections on 127.0.0.1 and never answers: a hung webhook."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.held: list[socket.socket] = []
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def stop(self) -> None:
        self.closed.set()
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(timeout=5)
        for conn in self.held:
            conn.close()


class _SmallServer:
    """A threaded HTTP server on 127.0.0.1 whose subclass answers each request: its status
    (`answer`), headers (`headers_for`) and body (`body_for`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: list[Received] = []
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def answer(self, method: str, received: Received) -> int:
        raise NotImplementedError

    def headers_for(self, received: Received) -> dict[str, str]:
        """Headers to answer `received` with, beside its status (none by default)."""
        return {}

    def body_for(self, received: Received) -> bytes:
        """The body to answer `received` with, once its status is `received.answered`
        (none by default)."""
        return b""

    def start(self) -> _SmallServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", "0")))
                url = urllib.parse.urlsplit(self.path)
                received = Received(
                    path=url.path,
                    headers=dict(self.headers.items()),
                    body=json.loads(raw) if raw else None,
                    raw=raw,
                    query=dict(urllib.parse.parse_qsl(url.query)),
                    at_s=time.monotonic(),
                )
                status = owner.answer(method, received)
                with owner.lock:
                    received.answered = status
                    owner.received.append(received)
                body = owner.body_for(received)
                try:
                    self.send_response(status)
                    for name, value in owner.headers_for(received).items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    # The client gave up waiting (a timeout), or read what it wanted of the
                    # body and left.
                    self.close_connection = True

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def log_message(self, *_args: Any) -> None:
                return

        self.server = LocalServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def snapshot(self) -> list[Received]:
        with self.lock:
            return list(self.received)


class StillProcessing(_SmallServer):
    """A downstream that never accepts: it works on the first POST of an Idempotency-Key
    for `hold_s` and then fails it (500); while that one is in progress it answers any
    other POST with the same key 409 ("still processing"), and 500 once it has failed."""

    def __init__(self, *, hold_s: float) -> None:
        super().__init__()
        self.hold_s = hold_s
        self.in_progress: set[str] = set()
        self.failed: set[str] = set()
        self.stopping = threading.Event()

    def answer(self, method: str, received: Received) -> int:
        key = received.headers.get("Idempotency-Key", "")
        with self.lock:
            if key in self.in_progress:
                return 409
            if key in self.failed:
                return 500
            self.in_progress.add(key)
        self.stopping.wait(self.hold_s)  # released at once when the test stops us
        with self.lock:
            self.in_progress.discard(key)
            self.failed.add(key)
        return 500

    def stop(self) -> None:
        self.stopping.set()
        super().stop()


class KnownIds(_SmallServer):
    """A downstream's check endpoint: GET `/records/<id>` is 200 for the ids it has and
    404 for any other."""

    def __init__(self, known: set[str]) -> None:
        super().__init__()
        self.known = set(known)

    def answer(self, method: str, received: Received) -> int:
        prefix = "/records/"
        if method != "GET" or not received.path.startswith(prefix):
            return 404
        record_id = urllib.parse.unquote(received.path[len(prefix) :])
        return 200 if record_id in self.known else 404
