"""The trace context's pure parts: a traceparent's trace id, the collector's URL, and tracing
switched off."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from app.delivery.sinks import client_span
from app.telemetry.tracing import (
    NO_TRACER,
    current_traceparent,
    make_tracer_provider,
    parent_context,
    trace_id_of,
    traceparent_of,
    traces_url,
)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("traceparent", "trace_id"),
    [
        (f"00-{TRACE_ID}-00f067aa0ba902b7-01", TRACE_ID),
        (f"00-{TRACE_ID}-00f067aa0ba902b7-00", TRACE_ID),  # not sampled: still its trace
        (None, None),
        ("", None),
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", None),  # an all-zero trace id is invalid
        (f"00-{TRACE_ID}-{'0' * 16}-01", None),  # so is an all-zero span id
        (f"00-{TRACE_ID.upper()}-00f067aa0ba902b7-01", None),  # lowercase only
        (f"01-{TRACE_ID}-00f067aa0ba902b7-01", None),  # a version this does not read
        (f"00-{TRACE_ID}-00f067aa0ba902b7-01-extra", None),
    ],
)
def test_a_traceparent_gives_its_trace_id_only_when_valid(traceparent, trace_id):
    assert trace_id_of(traceparent) == trace_id


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("http://collector:4318/", "http://collector:4318/v1/traces"),
        ("https://otel.example/prefix", "https://otel.example/prefix/v1/traces"),
        ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
    ],
)
def test_the_endpoint_is_the_collectors_base_url_or_its_traces_url(endpoint, url):
    assert traces_url(endpoint) == url


@pytest.mark.parametrize("endpoint", [None, ""])
def test_without_an_endpoint_nothing_is_traced(endpoint):
    # No provider: the pieces are given the API's no-op tracer (as `Runtime.build` does).
    assert make_tracer_provider(endpoint, service="pipeline-intake") is None
    with NO_TRACER.start_as_current_span("POST", kind=SpanKind.SERVER) as span:
        assert traceparent_of(span) is None
        assert traceparent_of(trace.get_current_span()) is None
    assert traceparent_of(NO_TRACER.start_span("push order", kind=SpanKind.PRODUCER)) is None


def test_a_process_not_tracing_passes_no_trace_it_received_on():
    # The API's no-op tracer alone would carry a received traceparent on to its spans.
    received = parent_context(NO_TRACER, f"00-{TRACE_ID}-00f067aa0ba902b7-01")
    with NO_TRACER.start_as_current_span(
        "attempt order", context=received, kind=SpanKind.CONSUMER
    ) as span:
        assert traceparent_of(span) is None


def test_a_process_not_tracing_keeps_and_sends_no_trace_of_another_instrumentation():
    """Another OpenTelemetry instrumentation of the host (its own provider, its span current)
    is not ours: with tracing off, a record stores no traceparent and a sink call sends none."""
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415 - the otel extra

    foreign = TracerProvider().get_tracer("someone-else")
    with foreign.start_as_current_span("their request"):
        assert traceparent_of(trace.get_current_span()) is not None  # theirs is there
        assert current_traceparent(NO_TRACER) is None
        headers: dict[str, str] = {}
        with client_span(NO_TRACER, "http://127.0.0.1:9/x", headers) as span:
            assert not span.is_recording()
        assert headers == {}
    ours = TracerProvider().get_tracer("ours")
    with ours.start_as_current_span("our request") as span:
        assert current_traceparent(ours) == traceparent_of(span)
