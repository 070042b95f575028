"""Tracing a record across processes (W3C trace context) on the OpenTelemetry API, off unless
an OTLP endpoint is set.

With `PIPELINE_OTEL_ENDPOINT` (an OTLP/HTTP collector, e.g. `http://collector:4318`) each
process exports its spans there with the OpenTelemetry SDK (the `otel` extra), from the
tracer provider `make_tracer_provider` builds for it: the intake's request span (FastAPI's
own), one push span per record, the worker's attempt span and the sink's outbound call.
They are linked by a `traceparent`: the intake stores its request span's with the record,
each push message carries one per record, and the downstream receives the sink call's as
the `traceparent` header.

Without the endpoint there is no provider and the pieces hold `NO_TRACER`, the API's no-op
tracer: no span is recorded and no trace context received from another process is taken up
(`parent_context`), so none is passed on. The product runs without the SDK installed;
asking for tracing without it is a `ConfigError` at start."""

from __future__ import annotations

import os
import re
import socket
import urllib.parse
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.errors import ConfigError
from app.telemetry.logs import get_logger

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = get_logger(__name__)

# W3C Trace Context, version 00: `00-<trace id>-<parent span id>-<flags>`, lowercase hex; an
# all-zero trace or span id is invalid.
_TRACEPARENT = re.compile(r"^00-(?!0{32})([0-9a-f]{32})-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")
# Where an OTLP/HTTP collector takes spans, below its base URL (the OTLP specification).
OTLP_TRACES_PATH = "/v1/traces"
# The instrumentation scope our own spans are reported under.
SCOPE = "durable-pipeline"
_W3C = TraceContextTextMapPropagator()
# What the pieces trace with when tracing is off.
NO_TRACER: Tracer = trace.NoOpTracer()


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id (32 hex digits) of a valid version-00 traceparent; None otherwise."""
    found = _TRACEPARENT.match(traceparent or "")
    return found.group(1) if found else None


def traceparent_of(span: Span) -> str | None:
    """`span`'s context as a W3C traceparent; None when it is in no trace (the current span
    outside any, or a no-op tracer's)."""
    if not span.get_span_context().is_valid:
        return None  # the common case when tracing is off: no propagator at all
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def current_traceparent(tracer: Tracer) -> str | None:
    """The traceparent of the span current in this context, when `tracer` traces; None for
    the no-op tracer, whatever is current: a span of another instrumentation of the host
    (its own provider) is not in our trace, and a process not tracing keeps none."""
    if isinstance(tracer, trace.NoOpTracer):
        return None
    return traceparent_of(trace.get_current_span())


def parent_context(tracer: Tracer, traceparent: str | None) -> Context | None:
    """The context in which a span of `tracer` is the child of `traceparent`, received from
    another process (one that does not parse gives an empty context: the span starts a
    trace). None, the current context, without a traceparent or for the no-op tracer: the
    API's would carry the trace on, which a process not tracing does not."""
    if traceparent is None or isinstance(tracer, trace.NoOpTracer):
        return None
    return _W3C.extract({"traceparent": traceparent})


def traces_url(endpoint: str) -> str:
    """Where spans are posted: `endpoint` itself when it already ends with `/v1/traces`,
    else that path below it (as `OTEL_EXPORTER_OTLP_ENDPOINT` is read)."""
    parts = urllib.parse.urlsplit(endpoint)
    path = parts.path.rstrip("/")
    if not path.endswith(OTLP_TRACES_PATH):
        path += OTLP_TRACES_PATH
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def make_tracer_provider(endpoint: str | None, *, service: str) -> TracerProvider | None:
    """None without `endpoint`; else an SDK tracer provider whose spans, of the service
    `service`, are batched and posted to the OTLP/HTTP collector at `endpoint`. It is not
    installed as OpenTelemetry's global one: the caller passes it (or its tracer) to what
    makes spans, and shuts it down. The SDK's and the exporter's standard `OTEL_` variables
    (sampler, batch delays, headers, timeout, `OTEL_SERVICE_NAME`) apply. Raises
    `ConfigError` when the SDK or its OTLP exporter is not installed."""
    if not endpoint:
        return None
    # The SDK is optional: imported only when asked for.
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(
            "PIPELINE_OTEL_ENDPOINT is set but the OpenTelemetry SDK or its OTLP exporter is "
            f"not installed ({exc.name or exc}): pip install 'durable-pipeline[otel]'"
        ) from exc
    named = os.environ.get("OTEL_SERVICE_NAME")  # the standard variable wins
    attributes = {"service.instance.id": f"{socket.gethostname()}:{os.getpid()}"}
    if not named:
        attributes["service.name"] = service
    provider = TracerProvider(resource=Resource.create(attributes))
    url = traces_url(endpoint)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    # Where to, without credentials or query: the URL may carry them.
    parts = urllib.parse.urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    log.info(
        "tracing_on",
        service=named or service,
        collector=f"{parts.scheme}://{parts.hostname}{port}{parts.path}",
    )
    return provider
