"""The trace context's pure parts: a traceparent's trace id, the collector's URL, and tracing
switched off."""

from __future__ import annotations

import pytest

from app.telemetry.tracing import NO_TRACING, SpanKind, make_tracing, trace_id_of, traces_url

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
    tracing = make_tracing(endpoint, service="pipeline-intake")
    assert tracing is NO_TRACING
    assert not tracing.enabled
    with tracing.span("POST", kind=SpanKind.SERVER) as span:
        assert span.traceparent is None
        assert tracing.current_traceparent() is None
    assert tracing.start("push order", kind=SpanKind.PRODUCER).traceparent is None
