"""The push spans of traced records: one per record (a message of a batch carries records of
different traces), each a child of the record's own traceparent, whose traceparent its
message carries for the worker (`app.admission.push.build_message`)."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer

from app.telemetry.tracing import parent_context, traceparent_of


class PushSpans:
    """The spans of one push: started before it, ended after it with what became of each
    record (pushed, or left out by the bound)."""

    def __init__(
        self,
        tracer: Tracer,
        *,
        queue: str,
        record_ids: Sequence[str],
        traceparents: Sequence[str | None] | None,
    ) -> None:
        self._spans: dict[str, Span] = {}
        if traceparents is None:
            return
        for record_id, parent in zip(record_ids, traceparents, strict=True):
            context = parent_context(tracer, parent)
            if context is None:
                continue  # untraced (taken in before tracing was on, say), or not tracing
            self._spans[record_id] = tracer.start_span(
                f"push {queue}",
                context=context,
                kind=SpanKind.PRODUCER,
                attributes={
                    "messaging.system": "redis",
                    "messaging.operation.type": "send",
                    "messaging.destination.name": queue,
                    "pipeline.record_id": record_id,
                },
            )

    def of(self, record_ids: str | Sequence[str]) -> dict[str, str] | None:
        """`{record id: traceparent}` for a message of `record_ids`; None if none is traced."""
        ids = [record_ids] if isinstance(record_ids, str) else record_ids
        found = {
            record_id: parent
            for record_id in ids
            if record_id in self._spans and (parent := traceparent_of(self._spans[record_id]))
        }
        return found or None

    def finish(
        self, record_ids: Sequence[str], *, pushed: Sequence[bool], error: str | None = None
    ) -> None:
        """End the spans: each of `record_ids` went onto the queue or not (`pushed`, one
        flag each): left out by the bound, or by `error` (the push failed)."""
        for record_id, went in zip(record_ids, pushed, strict=True):
            span = self._spans.pop(record_id, None)
            if span is None:
                continue
            span.set_attribute("pipeline.pushed", went)
            if error is not None:
                span.set_status(StatusCode.ERROR, error)
            span.end()
