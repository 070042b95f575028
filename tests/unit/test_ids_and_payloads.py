from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest

from app.delivery.push import TASK_NAME, build_message
from app.errors import InvalidPayload
from app.ids import new_id
from app.intake.body import parse_payload
from app.payloads import Payload, StatusPayload


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
