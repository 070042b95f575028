"""Tracing a record across processes (W3C trace context), off unless an OTLP endpoint is set.

With `PIPELINE_OTEL_ENDPOINT` (an OTLP/HTTP collector, e.g. `http://collector:4318`) each
process exports its spans there with the OpenTelemetry SDK (the `otel` extra): the intake's
request span, one push span per record, the worker's attempt span and the sink's outbound
call. They are linked by a `traceparent`: the intake stores its request span's with the
record, each push message carries one per record, and the downstream receives the sink
call's as the `traceparent` header.

Without the endpoint `make_tracing` answers `NO_TRACING`: nothing is imported from
OpenTelemetry, no span is made, no header is sent. The product runs without the SDK
installed; asking for tracing without it is a `ConfigError` at start.

The rest of the pipeline sees only `Tracing` and `Span` below."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from enum import StrEnum
from typing import Protocol

from app.errors import ConfigError

# W3C Trace Context, version 00: `00-<trace id>-<parent span id>-<flags>`, lowercase hex; an
# all-zero trace or span id is invalid.
_TRACEPARENT = re.compile(r"^00-(?!0{32})([0-9a-f]{32})-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")
# The length of a version-00 traceparent (the journal's column holds one).
TRACEPARENT_LENGTH = 55
# Where an OTLP/HTTP collector takes spans, below its base URL (the OTLP specification).
OTLP_TRACES_PATH = "/v1/traces"

# An attribute's value, as the OpenTelemetry API takes it.
AttributeValue = str | bool | int | float


class SpanKind(StrEnum):
    """OpenTelemetry's span kinds, as the pipeline uses them."""

    SERVER = "server"  # the intake answering a request
    CLIENT = "client"  # an outbound HTTP call (the sink's POST)
    PRODUCER = "producer"  # a record's push onto its queue
    CONSUMER = "consumer"  # a worker's attempt of a record
    INTERNAL = "internal"


class Span(Protocol):
    """One span, open until `end()` (or the end of its `with` block)."""

    @property
    def traceparent(self) -> str | None:
        """This span's context as a W3C traceparent (None when nothing is traced)."""

    def set_attribute(self, name: str, value: AttributeValue) -> None: ...

    def rename(self, name: str) -> None: ...

    def fail(self, description: str) -> None:
        """Mark the span's operation as failed (its status: error)."""

    def end(self) -> None: ...


class Tracing(Protocol):
    """Makes spans. `parent` is a traceparent received from another process; without one, a
    span is a child of the current span of this thread or task (a new trace if none)."""

    @property
    def enabled(self) -> bool: ...

    def start(
        self,
        name: str,
        *,
        kind: SpanKind,
        parent: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> Span:
        """A span, not made current: the caller ends it."""

    def span(
        self,
        name: str,
        *,
        kind: SpanKind,
        parent: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> AbstractContextManager[Span]:
        """A span that is the current one within the block and ends with it; an exception
        leaving the block is recorded on it and marks it failed."""

    def current_traceparent(self) -> str | None:
        """The current span's traceparent; None outside a span, or when nothing is traced."""

    def flush(self, *, timeout_s: float = 5.0) -> None:
        """Export the spans waiting now (a process about to exit without `close`)."""

    def close(self) -> None:
        """Export what is waiting, then stop exporting."""


class _NoSpan:
    traceparent = None

    def set_attribute(self, name: str, value: AttributeValue) -> None:
        return

    def rename(self, name: str) -> None:
        return

    def fail(self, description: str) -> None:
        return

    def end(self) -> None:
        return


NO_SPAN: Span = _NoSpan()


class NoTracing:
    """Tracing switched off: no span, no traceparent, nothing exported."""

    enabled = False

    def start(
        self,
        name: str,
        *,
        kind: SpanKind,
        parent: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> Span:
        return NO_SPAN

    @contextmanager
    def span(
        self,
        name: str,
        *,
        kind: SpanKind,
        parent: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> Iterator[Span]:
        yield NO_SPAN

    def current_traceparent(self) -> str | None:
        return None

    def flush(self, *, timeout_s: float = 5.0) -> None:
        return

    def close(self) -> None:
        return


NO_TRACING: Tracing = NoTracing()


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id (32 hex digits) of a valid version-00 traceparent; None otherwise."""
    found = _TRACEPARENT.match(traceparent or "")
    return found.group(1) if found else None


def traces_url(endpoint: str) -> str:
    """Where spans are posted: `endpoint` itself when it already ends with `/v1/traces`,
    else that path below it (as `OTEL_EXPORTER_OTLP_ENDPOINT` is read)."""
    parts = urllib.parse.urlsplit(endpoint)
    path = parts.path.rstrip("/")
    if not path.endswith(OTLP_TRACES_PATH):
        path += OTLP_TRACES_PATH
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def make_tracing(endpoint: str | None, *, service: str) -> Tracing:
    """`NO_TRACING` without `endpoint`; else spans of the service `service` exported to the
    OTLP/HTTP collector at `endpoint`. Raises `ConfigError` when the endpoint is set and
    the OpenTelemetry SDK or its OTLP exporter is not installed."""
    if not endpoint:
        return NO_TRACING
    try:
        from app.telemetry import otel  # noqa: PLC0415 - the SDK is optional: imported only when asked for
    except ImportError as exc:
        raise ConfigError(
            "PIPELINE_OTEL_ENDPOINT is set but the OpenTelemetry SDK or its OTLP exporter is "
            f"not installed ({exc.name or exc}): pip install 'durable-pipeline[otel]'"
        ) from exc
    return otel.OtelTracing(endpoint=traces_url(endpoint), service=service)
