"""What the intake answers a request sent again with its nonce: the record as it is now."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.clock import utcnow
from app.config.line_settings import Overflow
from app.ids import new_id
from app.journal.models import RecordStatus, Source
from app.journal.store import NewRecord
from tests.support.harness import signed_headers

KEY_ID, SECRET = "shop-1", "s3cret-value-of-shop-1"
BODY = b'{"business_no": "DUP-1"}'


def _sent_twice(line: str = "order") -> list[NewRecord]:
    """One request, as two requests that sent it with the same nonce and body carry it."""
    now = utcnow()
    return [
        NewRecord(
            id=new_id(now),
            line=line,
            business_no="DUP-1",
            source=Source.INTAKE,
            dedup_key=f"{KEY_ID}:nonce-twice",
            body_sha256="1" * 64,
            payload={"business_no": "DUP-1"},
        )
        for _ in range(2)
    ]


@pytest.mark.journal
def test_a_known_nonce_in_the_same_group_gets_the_status_its_record_was_admitted_with(harness):
    """Two requests with one nonce, committed in one group: the second is answered with
    the record's status after its push (`enqueued`), not the `received` it had when its
    row was found."""
    rt = harness.runtime()
    first, again = rt.acceptor.accept_many(_sent_twice(), clock=utcnow)
    assert (first.created, again.created) == (True, False)
    assert again.record.id == first.record.id
    assert (first.status, again.status) == (RecordStatus.ENQUEUED, RecordStatus.ENQUEUED)


@pytest.mark.journal
def test_a_known_nonce_in_the_same_group_as_its_rejected_record_is_rejected_too(harness):
    harness.configure(lines__order__max_queue_length="1", lines__order__overflow="reject")
    rt = harness.runtime()
    rt.acceptor.accept_many(
        [
            NewRecord(
                id=new_id(utcnow()),
                line="order",
                business_no="FILL-1",
                source=Source.INTAKE,
                dedup_key=f"{KEY_ID}:fill",
                body_sha256="2" * 64,
                payload={"business_no": "FILL-1"},
            )
        ],
        clock=utcnow,
    )
    first, again = rt.acceptor.accept_many(_sent_twice(), clock=utcnow, overflow=Overflow.REJECT)
    assert (first.status, again.status) == (RecordStatus.REJECTED, RecordStatus.REJECTED)


def test_a_known_nonce_is_answered_with_the_records_status_now(harness):
    harness.configure(intake_keys=json.dumps({KEY_ID: SECRET}))
    client = harness.start_intake()
    headers = signed_headers(KEY_ID, SECRET, BODY, nonce="nonce-now")
    first = client.post("/v1/order", content=BODY, headers=headers)
    assert first.status_code == 202, first.text
    assert first.json()["status"] == "enqueued"
    harness.start_worker("order")
    harness.wait_until_final({first.json()["id"]}, timeout_s=60)

    again = client.post("/v1/order", content=BODY, headers=headers)
    assert again.status_code == 200, again.text
    assert again.json() == {**first.json(), "status": "done"}
    assert harness.record_count() == 1


def test_requests_sent_at_once_with_one_nonce_all_get_the_records_status(harness):
    """However the intake groups them, every answer names the one record and the status
    it was admitted with: one 202, the others 200, all `enqueued`."""
    harness.configure(intake_keys=json.dumps({KEY_ID: SECRET}))
    client = harness.start_intake()
    headers = signed_headers(KEY_ID, SECRET, BODY, nonce="nonce-at-once")
    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(
            pool.map(lambda _: client.post("/v1/order", content=BODY, headers=headers), range(32))
        )
    assert sorted(a.status_code for a in answers) == [200] * 31 + [202]
    assert {(a.json()["id"], a.json()["status"]) for a in answers} == {
        (answers[0].json()["id"], "enqueued")
    }
    assert harness.record_count() == 1


@pytest.mark.parametrize(
    ("business_no", "problem"),
    [("ORD/1", "has a '/' or '\\'"), ("ORD\n1", "has a control character")],
)
def test_a_bad_business_no_is_answered_with_a_sentence_saying_what_is_allowed(
    harness, business_no, problem
):
    harness.configure(intake_keys=json.dumps({KEY_ID: SECRET}))
    client = harness.start_intake()
    body = json.dumps({"business_no": business_no}).encode()
    answer = client.post("/v1/order", content=body, headers=signed_headers(KEY_ID, SECRET, body))
    assert answer.status_code == 422
    assert answer.json()["error"] == {
        "code": "invalid_payload",
        "message": f"business_no: {problem}; a business number is 1 to 128 characters, "
        "without control characters (such as a newline or a tab), '/' or '\\', "
        "and is not '.' or '..'",
    }


def test_an_unknown_line_is_answered_with_the_known_ones(harness):
    harness.configure(intake_keys=json.dumps({KEY_ID: SECRET}))
    client = harness.start_intake()
    answer = client.post("/v1/orders", content=BODY, headers=signed_headers(KEY_ID, SECRET, BODY))
    assert answer.status_code == 404
    assert answer.json()["error"] == {
        "code": "unknown_line",
        "message": "unknown line 'orders'; the lines are: order, refund, status",
    }
