"""The HTTP layer maps the error tree by its middle categories, in one place."""

from __future__ import annotations

import json

import pytest

from app import errors
from app.intake.errors import response_for, status_for


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (errors.JournalUnavailable(), 503),
        (errors.BrokerUnavailable(), 503),
        (errors.Overloaded(), 503),
        (errors.ShuttingDown(), 503),
        (errors.InvalidPayload(), 422),
        (errors.MalformedBody(), 400),
        (errors.RequestTimeout(), 408),
        (errors.PayloadTooLarge(), 413),
        (errors.HeadersTooLarge(), 431),
        (errors.UnknownLine(), 404),
        (errors.RecordNotFound(), 404),
        (errors.BadSignature(), 401),
        (errors.AdminRequired(), 401),
        (errors.AdminNotConfigured(), 401),
        (errors.AdminForbidden(), 403),
        (errors.NonceReused(), 409),
        (errors.RateLimited(), 429),
        (errors.QueueFull(), 429),
        (errors.UnboundedPublish(), 500),
        (errors.ConfigError(), 500),
    ],
)
def test_each_error_is_answered_by_its_category(error, status):
    assert status_for(error) == status


def test_a_new_error_in_a_category_needs_no_new_mapping():
    class LineClosed(errors.Forbidden):
        """The line is closed."""

        code = "line_closed"

    assert status_for(LineClosed()) == 403


def test_a_failure_of_ours_shows_its_class_message_not_its_details():
    answer = response_for(errors.JournalUnavailable("connection to 10.0.0.7 refused"))
    body = json.loads(answer.body)
    assert body == {
        "error": {
            "code": "journal_unavailable",
            "message": "The journal is unavailable; nothing was accepted.",
        }
    }


def test_a_throttled_answer_says_when_to_come_back_and_carries_its_details():
    answer = response_for(errors.QueueFull("line 'order' is full", retry_after_s=5, id="01X"))
    assert answer.status_code == 429
    assert answer.headers["Retry-After"] == "5"
    assert json.loads(answer.body) == {
        "error": {"code": "queue_full", "message": "line 'order' is full"},
        "id": "01X",
    }


def test_a_readiness_failure_names_what_failed():
    answer = response_for(errors.NotReady("unavailable: redis", failed=["redis"]))
    assert answer.status_code == 503
    assert json.loads(answer.body)["error"]["message"] == "unavailable: redis"
    assert json.loads(answer.body)["failed"] == ["redis"]
