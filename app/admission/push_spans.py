"""The push spans of traced records: one per record (a message of a batch carries records of
different traces), each a child of the record's own traceparent, whose traceparent its
message carries for the worker (`app.admission.push.build_message`)."""

from __future__ import annotations

from collections.abc import Sequence

from app.telemetry.tracing import Span, SpanKind, Tracing


class PushSpans:
    """The spans of one push: started before it, ended after it with what became of each
    record (pushed, or left out by the bound)."""

    def __init__(
        self,
        tracing: Tracing,
        *,
        queue: str,
        record_ids: Sequence[str],
        traceparents: Sequence[str | None] | None,
    ) -> None:
        self._spans: dict[str, Span] = {}
        if not tracing.enabled or traceparents is None:
            return
        for record_id, parent in zip(record_ids, traceparents, strict=True):
            if parent is None:
                continue  # an untraced record (taken in before tracing was on, say)
            self._spans[record_id] = tracing.start(
                f"push {queue}",
                kind=SpanKind.PRODUCER,
                parent=parent,
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
            if record_id in self._spans and (parent := self._spans[record_id].traceparent)
        }
        return found or None

    def finish(self, record_ids: Sequence[str], *, pushed: int, error: str | None = None) -> None:
        """End the spans: the first `pushed` of `record_ids` went onto the queue; the rest
        were left out by the bound, or by `error` (the push failed)."""
        for n, record_id in enumerate(record_ids):
            span = self._spans.pop(record_id, None)
            if span is None:
                continue
            span.set_attribute("pipeline.pushed", n < pushed)
            if error is not None:
                span.fail(error)
            span.end()
