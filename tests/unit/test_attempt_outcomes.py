"""What an attempt's row and a task message say of an attempt, without I/O: its outcome
from its error, the start of the error kept, and the labels Flower searches by."""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta

import aiohttp

from app.admission.push import MAX_LABELS_REPR, labels_repr
from app.delivery.outcomes import failure_outcome, http_status_of
from app.errors import DeliveryFailed
from app.journal.attempt_log import MAX_ERROR_MESSAGE_LENGTH, Outcome, new_attempt

AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _raised_from(cause: BaseException) -> DeliveryFailed:
    """A delivery failure raised from `cause`, as the HTTP sink raises it."""
    failed = DeliveryFailed("POST http://downstream/in: no whole answer within 10 s")
    failed.__cause__ = cause
    return failed


def test_a_downstream_or_handler_that_timed_out_is_a_timeout_and_anything_else_a_failure():
    # The HTTP sink's one deadline ends a request with asyncio's TimeoutError.
    assert failure_outcome(_raised_from(TimeoutError())) is Outcome.TIMEOUT
    assert failure_outcome(TimeoutError("handler gave up")) is Outcome.TIMEOUT
    refused = aiohttp.ClientConnectionError("refused")
    assert failure_outcome(_raised_from(refused)) is Outcome.FAILED
    assert failure_outcome(RuntimeError("boom")) is Outcome.FAILED


def test_the_http_status_is_the_downstreams_answer_where_there_was_one():
    assert http_status_of(DeliveryFailed("POST …: HTTP 503", http_status=503)) == 503
    assert http_status_of(_raised_from(TimeoutError())) is None
    assert http_status_of(RuntimeError("boom")) is None


def test_a_row_keeps_the_start_of_the_error_and_never_a_negative_duration():
    row = new_attempt(
        record_id="01R",
        attempt=2,
        started_at=AT,
        finished_at=AT - timedelta(seconds=1),  # the wall clock stepped back
        worker=("h" * 300, 42),
        outcome=Outcome.FAILED,
        error=ValueError("x" * 2000),
    )
    assert (row.error_class, row.error_message) == ("ValueError", "x" * MAX_ERROR_MESSAGE_LENGTH)
    assert row.duration_ms == 0
    assert len(row.worker_host) == 100
    assert row.public()["worker"] == {"host": "h" * 100, "pid": 42}


def test_a_messages_labels_name_its_line_and_business_numbers_within_a_bound():
    assert ast.literal_eval(labels_repr("order", "B-1")) == {"line": "order", "business_no": "B-1"}
    assert ast.literal_eval(labels_repr("order", None)) == {"line": "order"}
    many = [f"B-{n:0100d}" for n in range(16)]
    labels = ast.literal_eval(labels_repr("order", many))
    assert len(labels_repr("order", many)) < MAX_LABELS_REPR + 100
    assert labels["business_no"] == many[: len(labels["business_no"])]
    assert labels["more"] == 16 - len(labels["business_no"]) > 0
