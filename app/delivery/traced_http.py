"""Outbound HTTP calls traced: a span per request made within a traced operation (the sink's
POST within a worker's attempt), whose traceparent the request carries as the W3C
`traceparent` header. A request made outside any span, or with tracing off, goes out as
it is."""

from __future__ import annotations

import httpx

from app.delivery.sinks import redact_url
from app.observe.tracing import SpanKind, Tracing

# Client spans fail on these answers (OpenTelemetry's HTTP conventions for a client).
FIRST_ERROR_STATUS = 400


class TracedTransport(httpx.BaseTransport):
    """`inner` with a client span around each request made within a span of `tracing`."""

    def __init__(self, inner: httpx.BaseTransport, *, tracing: Tracing) -> None:
        self._inner = inner
        self._tracing = tracing

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._tracing.current_traceparent() is None:
            return self._inner.handle_request(request)
        url = request.url
        attributes: dict[str, str | int] = {
            "http.request.method": request.method,
            "url.full": redact_url(str(url)),
            "server.address": url.host,
        }
        if url.port is not None:
            attributes["server.port"] = url.port
        with self._tracing.span(
            request.method, kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            if span.traceparent is not None:
                request.headers["traceparent"] = span.traceparent
            response = self._inner.handle_request(request)
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= FIRST_ERROR_STATUS:
                span.fail(f"HTTP {response.status_code}")
            return response

    def close(self) -> None:
        self._inner.close()
