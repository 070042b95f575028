"""The intake's limits on each request, before any route sees it: headers past a size or
count are refused with 431 (the size is also bounded while headers are read, by the HTTP
protocol `pipeline intake` runs: app.intake.protocol); requests in
flight past a number are answered 503 with `Retry-After` at once, rather than queued
until the process falls over. Health checks are exempt from the second, so an overloaded
intake still says it is alive. Both answers are the usual JSON error."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import HeadersTooLarge, Overloaded
from app.intake.errors import response_for

EXEMPT_PATHS = frozenset({"/healthz", "/readyz"})
MAX_HEADERS = 100
RETRY_AFTER_S = 1


class RequestLimits:
    """ASGI middleware: headers of at most `max_header_bytes` (and `MAX_HEADERS` of them),
    and at most `limit` HTTP requests in flight in this process."""

    def __init__(self, app: ASGIApp, *, limit: int, max_header_bytes: int) -> None:
        self.app = app
        self.limit = limit
        self.max_header_bytes = max_header_bytes
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        size = sum(len(name) + len(value) for name, value in headers)
        if size > self.max_header_bytes or len(headers) > MAX_HEADERS:
            message = (
                f"headers are over the limit of {self.max_header_bytes} bytes or {MAX_HEADERS}"
            )
            await response_for(HeadersTooLarge(message))(scope, receive, send)
            return
        if scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            response = response_for(Overloaded())
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
            await response(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
