"""uvicorn's httptools protocol with a bound on a request's headers while they are read.

httptools takes a header block of any size, and uvicorn hands the app the headers only once
all of them have arrived: a client could make an intake process hold hundreds of MiB (a
limit checked by the app comes too late), and a client that never ends its headers held
its connection for ever. This protocol counts the bytes of the request line and headers
as they arrive: past `max_header_bytes` (plus the request line's allowance) it answers 431
and closes the connection, before the parser takes more. And it closes a connection whose
headers have not all arrived `header_timeout_s` after it opened, or after its next request
began (with 408 when nothing else is being answered on it); idle time between requests is
the keep-alive timeout's. The rest is httptools' own path: a request's bytes reach the
parser in at most two pieces."""

from __future__ import annotations

import asyncio
import functools
from http import HTTPStatus
from typing import Any, cast

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from app.config.settings import Settings
from app.errors import HeadersTooLarge, PipelineError, RequestTimeout
from app.intake.errors import response_for
from app.intake.gate import MAX_HEADERS

# The defaults of the settings `PIPELINE_INTAKE_MAX_HEADER_BYTES` and
# `PIPELINE_INTAKE_HEADER_TIMEOUT_SECONDS`, for uvicorn started with this class by name.
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
DEFAULT_HEADER_TIMEOUT_S = 10.0
# What the parser reads besides the headers the app counts (names and values): the request
# line, up to nginx's default buffer for one (8 KiB), and each header's ": " and CRLF. A
# request the app would take is never cut off here.
REQUEST_LINE_ALLOWANCE = 8 * 1024 + 4 * MAX_HEADERS
# After a refusal the connection is half-closed and what the client still sends is read and
# dropped, for at most this long and this much: a connection closed with unread bytes is
# reset, and a reset can destroy the answer before the client has read it.
LINGER_S = 1.0
LINGER_BYTES = 1024 * 1024


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` with a header byte limit and a header timeout (module doc)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.max_header_bytes = max_header_bytes
        self.read_limit = max_header_bytes + REQUEST_LINE_ALLOWANCE
        self.header_timeout_s = header_timeout_s
        # Bytes fed to the parser since the headers we wait for began (None: we wait for
        # none; the parser is in a body, or the connection is done).
        self.header_bytes: int | None = 0
        # When the headers we wait for began to be awaited (loop time; None: we wait for
        # none). One timer per connection checks it: none is made per request.
        self.headers_since: float | None = None
        self.header_timer: asyncio.TimerHandle | None = None
        # Bytes still to drop after a refusal (None: not refused).
        self.linger_bytes: int | None = None

    # The connection's life.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.headers_since = self.loop.time()
        self._check_header_time_in(self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        self.header_bytes = self.headers_since = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.linger_bytes is not None:
            self.linger_bytes -= len(data)
            if self.linger_bytes < 0:
                self.transport.close()
            return
        # While headers are awaited, feed the parser no more than the room left under the
        # limit; the rest of `data` follows once they are complete (a body, or the next
        # pipelined request, whose count starts then).
        while self.header_bytes is not None and data:
            room = self.read_limit - self.header_bytes
            if room <= 0:
                self._refuse(HeadersTooLarge(f"headers are over {self.max_header_bytes} bytes"))
                return
            piece, data = data[:room], data[room:]
            self.header_bytes += len(piece)
            super().data_received(piece)
            if self.transport.is_closing():
                return
        if data:
            super().data_received(data)

    # Parser callbacks: where a request's headers begin and end.

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.header_bytes is None:
            self.header_bytes = 0
        if self.headers_since is None:
            self.headers_since = self.loop.time()

    def on_headers_complete(self) -> None:
        self.header_bytes = self.headers_since = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # The next request's headers, if any, count from here; its time from its first
        # byte (idle time between requests is the keep-alive timeout's to end).
        self.header_bytes = 0

    # The refusals.

    def _check_header_time_in(self, delay_s: float) -> None:
        self.header_timer = self.loop.call_later(delay_s, self._check_header_time)

    def _cancel_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _check_header_time(self) -> None:
        self.header_timer = None
        if self.transport.is_closing():
            return
        since = self.headers_since
        waited_s = 0.0 if since is None else self.loop.time() - since
        if waited_s < self.header_timeout_s:
            self._check_header_time_in(self.header_timeout_s - waited_s)
            return
        if (self.cycle is not None and not self.cycle.response_complete) or self.pipeline:
            # A request before it is still being answered, and reading may be paused until
            # it is: the wait is ours, not the client's.
            self._check_header_time_in(self.header_timeout_s)
            return
        self._refuse(
            RequestTimeout(f"the request's headers did not arrive within {self.header_timeout_s} s")
        )

    def _refuse(self, exc: PipelineError) -> None:
        """Answer `exc` (unless a response is under way on this connection) and close."""
        self.header_bytes = self.headers_since = None
        self._cancel_header_timer()
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()
            return
        response = response_for(exc)
        status = response.status_code
        head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
        head += [name + b": " + value for name, value in response.raw_headers]
        head.append(b"connection: close")
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + bytes(response.body))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.linger_bytes = LINGER_BYTES
        self.loop.call_later(LINGER_S, self.transport.close)


def protocol_for(settings: Settings) -> type[asyncio.Protocol]:
    """The `http` protocol to give uvicorn for `settings`' limits. It is a `partial` of the
    class, which uvicorn calls as it calls a class (keyword arguments `config`,
    `server_state`, `app_state`, `_loop`), and which pickles to the processes uvicorn
    starts for `--workers`."""
    factory = functools.partial(
        GuardedHttpToolsProtocol,
        max_header_bytes=settings.intake_max_header_bytes,
        header_timeout_s=settings.intake_header_timeout_seconds,
    )
    return cast("type[asyncio.Protocol]", factory)


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for an intake process (every way `pipeline` starts one)."""
    return {
        "http": protocol_for(settings),
        "timeout_keep_alive": settings.intake_keep_alive_seconds,
        # A backstop behind the app's own limit (which answers with the JSON error).
        "limit_concurrency": settings.intake_max_concurrent_requests * 2,
        "server_header": False,
        "log_level": "warning",
    }
