"""A proxy of the tests' own, on 127.0.0.1, that refuses every request and records it. A
browser told to use it (`--proxy-server`) reaches no host but this machine: Chromium never
sends loopback addresses through a proxy, and everything else ends here, answered 502, so a
test sees each attempt to fetch from elsewhere (a CDN, a font, a validator)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support.recorder import LocalServer


@dataclass
class RefusingProxy:
    asked: list[str] = field(default_factory=list)  # "METHOD target", in order
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def requests(self) -> list[str]:
        with self.lock:
            return list(self.asked)

    def start(self) -> RefusingProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def refuse(self) -> None:
                with proxy.lock:
                    proxy.asked.append(f"{self.command} {self.path}")
                self.close_connection = True
                self.send_response(502)
                self.send_header("Content-Length", "0")
                self.send_header("Connection", "close")
                self.end_headers()

            def __getattr__(self, name: str) -> Callable[[], None]:
                if name.startswith("do_"):  # whatever the method: GET, CONNECT, ...
                    return self.refuse
                raise AttributeError(name)

            def log_message(self, *_args: object) -> None:
                return  # the test reads `asked`, not a log

        self.server = LocalServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.thread is not None:
            self.thread.join(timeout=10)
