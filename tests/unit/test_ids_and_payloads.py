from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest

from app.admission.push import TASK_NAME, build_message
from app.errors import InvalidPayload
from app.ids import new_id
from app.intake.body import parse_payload
from app.payloads import BUSINESS_NO_PATTERN, BUSINESS_NO_RULE, Payload, StatusPayload


def test_ids_are_26_chars_unique_and_sort_by_creation_time():
    start = datetime(2026, 1, 1, tzinfo=UTC)
    ids = [new_id(start + timedelta(milliseconds=n)) for n in range(200)]
    assert all(len(i) == 26 for i in ids)
    assert ids == sorted(ids)
    assert len({new_id(start) for _ in range(1000)}) == 1000


def test_status_payload_is_stored_in_canonical_form():
    body = (
        b'{"business_no": "A-1", "status": "paid", '
        b'"occurred_at": "2026-03-01T12:00:00+02:00", "x": 1}'
    )
    payload = parse_payload(body, StatusPayload)
    assert payload == {
        "business_no": "A-1",
        "status": "paid",
        "occurred_at": "2026-03-01T12:00:00+02:00",
        "x": 1,
    }


def test_business_no_with_control_characters_is_refused():
    with pytest.raises(InvalidPayload, match="business_no"):
        parse_payload(b'{"business_no": "A\\nB"}', Payload)


def test_task_message_is_celery_protocol_2_json_with_the_record_id_as_task_id():
    raw = build_message("01ABC", queue="order", origin="1@host")
    message = json.loads(raw)
    assert message["content-type"] == "application/json"
    assert message["headers"]["task"] == TASK_NAME
    assert message["headers"]["id"] == message["properties"]["correlation_id"] == "01ABC"
    assert message["properties"]["delivery_info"] == {"exchange": "", "routing_key": "order"}
    args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    assert (args, kwargs) == (["01ABC"], {})
    other = json.loads(build_message("01ABC", queue="order", origin="1@host"))
    assert other["properties"]["delivery_tag"] != message["properties"]["delivery_tag"]


@pytest.mark.parametrize(
    ("business_no", "problem"),
    [
        ("A/B", "has a '/' or '\\'"),
        ("A\\B", "has a '/' or '\\'"),
        ("A\tB", "has a control character"),
        ("..", "is '..'"),
        ("", "is empty"),
        ("X" * 129, "has 129 characters"),
    ],
)
def test_a_bad_business_no_is_told_what_is_allowed_in_words(business_no, problem):
    body = json.dumps({"business_no": business_no}).encode()
    with pytest.raises(InvalidPayload) as refused:
        parse_payload(body, Payload)
    assert refused.value.message == f"business_no: {problem}; {BUSINESS_NO_RULE}"
    assert "^" not in refused.value.message  # no regular expression


def test_a_missing_business_no_is_required_in_words():
    with pytest.raises(InvalidPayload) as refused:
        parse_payload(b'{"amount": 3}', Payload)
    assert refused.value.message == "business_no: is required"


def test_the_openapi_schema_keeps_the_business_no_constraints():
    schema = Payload.model_json_schema()["properties"]["business_no"]
    assert (schema["minLength"], schema["maxLength"], schema["pattern"]) == (
        1,
        128,
        BUSINESS_NO_PATTERN,
    )
    assert schema["not"] == {"enum": [".", ".."]}
