"""A real OTLP/HTTP collector on 127.0.0.1 that records the spans posted to it: the tracing
backend double. It decodes the protobuf requests the OpenTelemetry exporter sends with the
OTLP's own message classes (opentelemetry-proto, from the `otel` extra)."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from tests.support.recorder import LocalServer

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the collector received it; ids in lowercase hex ("" for no parent)."""

    service: str
    name: str
    kind: str  # "server", "client", "producer", "consumer", "internal"
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    failed: bool


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return getattr(value, which) if which else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


def _kind(span: ProtoSpan) -> str:
    return ProtoSpan.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_").lower()


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one OTLP/HTTP protobuf export request."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=service,
                        name=span.name,
                        kind=_kind(span),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        attributes=_attributes(span.attributes),
                        failed=span.status.code == Status.STATUS_CODE_ERROR,
                    )
                )
    return spans


@dataclass
class Collector:
    """Posts received (every one counted, even one that did not decode) and their spans."""

    posts: int = 0
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """The collector's base URL, as `PIPELINE_OTEL_ENDPOINT` takes it."""
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Collector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    raw = gzip.decompress(raw)
                with collector.lock:
                    collector.posts += 1
                if self.path != TRACES_PATH:
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                spans = decode(raw)
                with collector.lock:
                    collector.spans.extend(spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_args: Any) -> None:
                return

        self.server = LocalServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def snapshot(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)
