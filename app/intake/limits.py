"""The intake's limit on requests in flight: past it, a request is answered 503 with the
usual JSON error and `Retry-After` at once, rather than queued until the process falls
over. Health checks are exempt, so an overloaded intake still says it is alive."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import Overloaded
from app.intake.errors import error_response

EXEMPT_PATHS = frozenset({"/healthz", "/readyz"})
RETRY_AFTER_S = 1


class ConcurrencyLimit:
    """ASGI middleware: at most `limit` HTTP requests in flight in this process."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            response = error_response(503, Overloaded.code, (Overloaded.__doc__ or "").strip())
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
            await response(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
