"""The intake's request spans (`app.telemetry.tracing`): one SERVER span per HTTP request,
named by its method and route (`POST /v1/{line}`), current while the app answers it, and a
child of the caller's `traceparent` header when one is sent."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.telemetry.tracing import SpanKind, Tracing

# Server spans fail on these answers (OpenTelemetry's HTTP conventions for a server).
FIRST_ERROR_STATUS = 500


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


class RequestSpans:
    """ASGI middleware: each HTTP request answered within a span of `tracing`."""

    def __init__(self, app: ASGIApp, *, tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = str(scope["method"])
        attributes = {"http.request.method": method, "url.path": str(scope["path"])}
        with self.tracing.span(
            method,
            kind=SpanKind.SERVER,
            parent=_header(scope, b"traceparent"),
            attributes=attributes,
        ) as span:

            async def sending(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.response.status_code", status)
                    if status >= FIRST_ERROR_STATUS:
                        span.fail(f"HTTP {status}")
                await send(message)

            try:
                await self.app(scope, receive, sending)
            finally:
                # Known once routed: the route's template, not the path (one name per route).
                route = getattr(scope.get("route"), "path_format", None)
                if isinstance(route, str):
                    span.rename(f"{method} {route}")
                    span.set_attribute("http.route", route)
