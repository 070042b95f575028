"""`Tracing` with the OpenTelemetry SDK, exporting over OTLP/HTTP.

Imported only by `app.telemetry.tracing.make_tracing` when an endpoint is set: importing it
needs the `otel` extra. Each `OtelTracing` has its own tracer provider (none is installed
as OpenTelemetry's global one); the current span is OpenTelemetry's context, so it follows
a request from the intake's middleware into its endpoint and into threads started with a
copy of the context. The standard `OTEL_` variables of the SDK and of the exporter
(sampler, batch delays, headers, timeout, `OTEL_SERVICE_NAME`) apply."""

from __future__ import annotations

import os
import socket
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.telemetry.logs import get_logger
from app.telemetry.tracing import AttributeValue, Span, SpanKind

log = get_logger(__name__)

_PROPAGATOR = TraceContextTextMapPropagator()
_KINDS = {
    SpanKind.SERVER: trace.SpanKind.SERVER,
    SpanKind.CLIENT: trace.SpanKind.CLIENT,
    SpanKind.PRODUCER: trace.SpanKind.PRODUCER,
    SpanKind.CONSUMER: trace.SpanKind.CONSUMER,
    SpanKind.INTERNAL: trace.SpanKind.INTERNAL,
}
# The instrumentation scope our spans are reported under.
SCOPE = "durable-pipeline"


def _traceparent(span: trace.Span) -> str | None:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


class OtelSpan:
    """A `Span` over an OpenTelemetry span."""

    def __init__(self, span: trace.Span) -> None:
        self.otel_span = span

    @property
    def traceparent(self) -> str | None:
        return _traceparent(self.otel_span)

    def set_attribute(self, name: str, value: AttributeValue) -> None:
        self.otel_span.set_attribute(name, value)

    def rename(self, name: str) -> None:
        self.otel_span.update_name(name)

    def fail(self, description: str) -> None:
        self.otel_span.set_status(Status(StatusCode.ERROR, description))

    def end(self) -> None:
        self.otel_span.end()


class OtelTracing:
    """Spans of one process, batched and posted to an OTLP/HTTP collector at `endpoint` (the
    full URL, `…/v1/traces`)."""

    enabled = True

    def __init__(self, *, endpoint: str, service: str) -> None:
        attributes: dict[str, AttributeValue] = {
            "service.instance.id": f"{socket.gethostname()}:{os.getpid()}"
        }
        if not os.environ.get("OTEL_SERVICE_NAME"):  # the standard variable wins
            attributes["service.name"] = service
        self._provider = TracerProvider(resource=Resource.create(attributes))
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self._tracer = self._provider.get_tracer(SCOPE)
        # Where to, without credentials or query: the URL may carry them.
        parts = urllib.parse.urlsplit(endpoint)
        shown = f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"
        log.info(
            "tracing_on",
            service=os.environ.get("OTEL_SERVICE_NAME") or service,
            collector=shown + parts.path,
        )

    def start(
        self,
        name: str,
        *,
        kind: SpanKind,
        parent: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> OtelSpan:
        # A traceparent that does not parse gives an empty context: the span starts a trace.
        context: Context | None = (
            _PROPAGATOR.extract({"traceparent": parent}) if parent is not None else None
        )
        span = self._tracer.start_span(
            name, context=context, kind=_KINDS[kind], attributes=attributes
        )
        return OtelSpan(span)

    @contextmanager
    def span(
        self,
        name: str,
        *,
        kind: SpanKind,
        parent: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> Iterator[Span]:
        handle = self.start(name, kind=kind, parent=parent, attributes=attributes)
        with trace.use_span(
            handle.otel_span,
            end_on_exit=True,
            record_exception=True,
            set_status_on_exception=True,
        ):
            yield handle

    def current_traceparent(self) -> str | None:
        span = trace.get_current_span()
        return _traceparent(span) if span.get_span_context().is_valid else None

    def close(self) -> None:
        self._provider.shutdown()

    def flush(self, *, timeout_s: float = 5.0) -> None:
        """Export the spans waiting in this process now (before it exits without `close`)."""
        self._provider.force_flush(timeout_millis=int(timeout_s * 1000))
