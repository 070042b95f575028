"""The reason of a refusal is kept: an attempt's row keeps the start of the downstream's
answer (`http_answer`, at most 2 KiB, URLs redacted), the record's `last_error` quotes it,
and the list of records finds it by any of its words, in any case (`error`), shows each
record's last attempt, pages newest first (`order=newest`) and selects records by id for a
bulk action. Attempts run in the test's process, against a real downstream on 127.0.0.1."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from app.delivery.sinks import MAX_ANSWER_BYTES, MAX_QUOTED_ANSWER
from app.journal import audit, store
from app.journal.models import RecordStatus
from app.journal.store import RecordFilter
from tests.support.journal import journal_records, run_records
from tests.support.processes import wait_for
from tests.support.recorder import Received, Recorder, _SmallServer

pytestmark = pytest.mark.journal

REFUSAL = '{"error": "unknown sku"}'
SECRET = "s3cret-token"
# A body far over what the sink reads of it.
HUGE_BYTES = 1_000_000


class Refusing(_SmallServer):
    """A downstream that refuses by business number: `BAD-…` 422 with `REFUSAL`, `HUGE-…`
    500 with a megabyte of text, `ECHO-…` 400 quoting the URL it was called at (secret
    and all); anything else is delivered (200)."""

    def answer(self, method: str, received: Received) -> int:
        return self._reply(received)[0]

    def headers_for(self, received: Received) -> dict[str, str]:
        return {"content-type": "application/json"}

    def body_for(self, received: Received) -> bytes:
        return self._reply(received)[1]

    def _reply(self, received: Received) -> tuple[int, bytes]:
        number = str(received.body["business_no"])
        if number.startswith("BAD-"):
            return 422, REFUSAL.encode()
        if number.startswith("HUGE-"):
            return 500, ("é  overloaded\n" * (HUGE_BYTES // 15)).encode()
        if number.startswith("LEAK-"):
            # The secret as a JSON string escapes it, as a path-only echo, and bare.
            echoed = json.dumps({"url": f"{self.url}{received.path}?token={SECRET}"})
            echoed = echoed.replace("/", "\\/")  # as PHP and others write JSON
            return 400, f"{echoed} Cannot POST /in?token={SECRET}; bad token {SECRET}".encode()
        if number.startswith("ECHO-"):
            query = urllib.parse.urlencode(received.query)
            return (
                400,
                f"no hook at {self.url}{received.path}?{query} "
                "(see https://u:pw@docs.example/x?k=v)".encode(),
            )
        return 200, b'{"ok": true}'


@pytest.fixture
def downstream() -> Iterator[Refusing]:
    server = Refusing().start()
    try:
        yield server
    finally:
        server.stop()


def shipments(harness, downstream: Refusing, numbers: list[str]) -> tuple[Any, list[str]]:
    """A runtime whose `shipment` line posts to `downstream` (its URL with a secret in the
    query), and one attempt of a record of each business number, in the order of their ids
    (the order of the list)."""
    harness.configure(
        lines__shipment__downstream_url=f"{downstream.url}/in?token={SECRET}",
        lines__shipment__max_attempts="5",
    )
    rt = harness.runtime()
    ids = []
    for number in numbers:
        payload = {"business_no": number}
        ids += journal_records(rt, [payload], line="shipment", status=RecordStatus.ENQUEUED)
        time.sleep(0.002)  # the next id in a later millisecond: ids are time-ordered
    run_records(rt, ids)
    return rt, ids


def in_order(ids: list[str]) -> list[str]:
    """Records' ids made in one instant, as the list orders them: ids are time-ordered, and
    random within a millisecond."""
    return sorted(ids)


def listed(client, **query: Any) -> dict[str, Any]:
    answer = client.get("/v1/records", params=query)
    assert answer.status_code == 200, answer.text
    return answer.json()


def found(client, **query: Any) -> list[str]:
    return [item["id"] for item in listed(client, **query)["items"]]


def test_a_refusal_keeps_the_downstreams_words_on_its_attempt_and_record(harness, downstream):
    _rt, (bad, good, other_bad) = shipments(harness, downstream, ["BAD-1", "OK-1", "BAD-2"])
    client = harness.start_intake()

    shown = client.get(f"/v1/records/{bad}").json()

    assert shown["status"] == "failed"
    assert shown["payload"] == {"business_no": "BAD-1"}
    [attempt] = shown["attempt_history"]
    assert (attempt["outcome"], attempt["http_status"]) == ("failed", 422)
    assert attempt["http_answer"] == REFUSAL
    assert shown["last_error"] == f"DeliveryFailed: POST {downstream.url}/in: HTTP 422: {REFUSAL}"
    assert attempt["error_message"] == f"POST {downstream.url}/in: HTTP 422: {REFUSAL}"
    # A done attempt keeps no answer.
    delivered = client.get(f"/v1/records/{good}").json()
    assert delivered["status"] == "done"
    assert [(a["outcome"], a["http_answer"]) for a in delivered["attempt_history"]] == [
        ("done", None)
    ]
    # The list shows each record's last attempt, its answer's start.
    items = {item["id"]: item for item in listed(client, line="shipment")["items"]}
    assert items[other_bad]["last_attempt"] == {
        "attempt": 1,
        "outcome": "failed",
        "http_status": 422,
        "http_answer": REFUSAL,
        "finished_at": items[other_bad]["last_attempt"]["finished_at"],
    }
    assert items[good]["last_attempt"]["outcome"] == "done"
    assert items[good]["last_attempt"]["http_answer"] is None


def test_a_record_never_attempted_has_no_last_attempt(harness):
    rt = harness.runtime()
    (waiting,) = journal_records(
        rt, [{"business_no": "W-1"}], line="order", status=RecordStatus.FAILED
    )
    client = harness.start_intake()
    [item] = listed(client, line="order")["items"]
    assert (item["id"], item["last_attempt"]) == (waiting, None)


def test_the_error_filter_finds_the_downstreams_words_in_any_case(harness, downstream):
    numbers = ["BAD-1", "OK-1", "HUGE-1", "BAD-2", "OK-2", "BAD-3"]
    rt, ids = shipments(harness, downstream, numbers)
    bad = [rid for rid, number in zip(ids, numbers, strict=True) if number.startswith("BAD-")]
    client = harness.start_intake()

    assert found(client, error="UNKNOWN SKU") == bad
    assert found(client, error="Unknown Sku", order="newest") == bad[::-1]
    assert found(client, error="unknown sku", line="shipment", status="failed") == bad
    assert found(client, error="unknown sku", line="order") == []
    assert found(client, error="unknown sku", status="dead") == []
    assert found(client, error="unknown sku", id=[bad[0], ids[1]]) == [bad[0]]
    assert found(client, error="OVERLOADED") == [ids[2]]
    # Pages of a search, newest first.
    first = listed(client, error="sku", order="newest", limit=2)
    assert [item["id"] for item in first["items"]] == bad[:0:-1]
    second = listed(client, error="sku", order="newest", limit=2, after=first["next"])
    assert ([item["id"] for item in second["items"]], second["next"]) == ([bad[0]], None)
    # A page of a search reads a bounded number of records with an error: fewer found,
    # and a cursor to go on from.
    with rt.journal.reading() as conn:
        where = RecordFilter(error_text="UNKNOWN sku")
        page = store.find_records(conn, where, limit=10, scan=2)
        assert (page.items[0].id, page.next) == (bad[0], ids[2])
        page = store.find_records(conn, where, limit=10, after=page.next, scan=2)
        assert ([r.id for r in page.items], page.next) == (bad[1:], bad[2])
        page = store.find_records(conn, where, limit=10, after=page.next, scan=2)
        assert (page.items, page.next) == ([], None)


def test_percent_and_underscore_in_the_error_words_match_only_themselves(harness):
    rt = harness.runtime()
    ids = in_order(
        journal_records(
            rt,
            [{"business_no": f"E-{n}"} for n in range(4)],
            line="order",
            status=RecordStatus.FAILED,
        )
    )
    errors = ["got 50% off_x: refused", "got 50X offYx: refused", "got 50% OFFYX", None]
    with rt.engine.begin() as conn:
        for rid, error in zip(ids, errors, strict=True):
            conn.execute(
                store.records.update().where(store.records.c.id == rid).values(last_error=error)
            )
    client = harness.start_intake()
    assert found(client, error="50% off_") == [ids[0]]
    assert found(client, error="% OFF") == [ids[0], ids[2]]
    assert found(client, error="50") == ids[:3]
    assert found(client, error="_") == [ids[0]]


def test_a_huge_answer_is_kept_cut_at_2_kib(harness, downstream):
    _rt, (huge,) = shipments(harness, downstream, ["HUGE-1"])
    client = harness.start_intake()
    shown = client.get(f"/v1/records/{huge}").json()
    [attempt] = shown["attempt_history"]
    assert attempt["http_status"] == 500
    answer = attempt["http_answer"]
    assert answer.startswith("é  overloaded\né  overloaded")
    assert len(answer.encode()) <= MAX_ANSWER_BYTES
    assert len(answer) >= MAX_ANSWER_BYTES - 200  # all of what was read, but a cut character
    assert "\ufffd" not in answer  # the character cut at the end is left out
    prefix = f"DeliveryFailed: POST {downstream.url}/in: HTTP 500: "
    assert shown["last_error"].startswith(prefix + "é overloaded é overloaded")
    assert len(shown["last_error"]) == len(prefix) + MAX_QUOTED_ANSWER
    [item] = listed(client, error="overloaded")["items"]
    assert item["last_attempt"]["http_answer"] == answer[:300]


def test_a_secret_in_a_url_of_the_answer_is_redacted(harness, downstream):
    _rt, (echo,) = shipments(harness, downstream, ["ECHO-1"])
    client = harness.start_intake()
    shown = client.get(f"/v1/records/{echo}").json()
    [attempt] = shown["attempt_history"]
    expected = f"no hook at {downstream.url}/in (see https://docs.example/x)"
    assert attempt["http_answer"] == expected
    assert shown["last_error"].endswith(f"HTTP 400: {expected}")
    assert SECRET not in json.dumps(shown)
    assert "pw@" not in json.dumps(shown)


def test_the_lines_secret_is_redacted_in_every_form_an_answer_echoes_it(harness, downstream):
    _rt, (leak,) = shipments(harness, downstream, ["LEAK-1"])
    client = harness.start_intake()
    shown = client.get(f"/v1/records/{leak}").json()
    [attempt] = shown["attempt_history"]
    assert attempt["http_status"] == 400
    assert "Cannot POST /in?token=" in attempt["http_answer"]
    assert SECRET not in json.dumps(shown), shown
    assert SECRET not in attempt["http_answer"]
    assert SECRET not in shown["last_error"]


def test_a_dead_records_alert_names_the_status_but_not_the_downstreams_words(harness, downstream):
    hooks = Recorder().start()
    try:
        harness.configure(
            alert_webhooks=json.dumps([{"kind": "generic", "url": f"{hooks.url}/hook"}]),
            lines__shipment__downstream_url=f"{downstream.url}/in",
            lines__shipment__max_attempts="1",
        )
        rt = harness.runtime()
        ids = journal_records(
            rt, [{"business_no": "BAD-1"}], line="shipment", status=RecordStatus.ENQUEUED
        )
        run_records(rt, ids)
        wait_for(hooks.snapshot, timeout_s=10, what="the TASK_DEAD message")
        [message] = [r.body for r in hooks.snapshot() if r.body["event"] == "TASK_DEAD"]
        assert message["details"]["error"] == f"DeliveryFailed: POST {downstream.url}/in: HTTP 422"
        assert "unknown sku" not in json.dumps(message)
        # The record itself keeps them.
        with rt.journal.reading() as conn:
            record = store.get_record(conn, ids[0])
        assert record is not None
        assert record.last_error is not None
        assert record.last_error.endswith(f"HTTP 422: {REFUSAL}")
    finally:
        hooks.stop()


def test_records_page_newest_first_with_their_cursor(harness):
    rt = harness.runtime()
    ids = in_order(
        journal_records(
            rt,
            [{"business_no": f"N-{n}"} for n in range(5)],
            line="order",
            status=RecordStatus.DEAD,
        )
    )
    client = harness.start_intake()
    assert found(client, line="order") == ids
    pages, cursor = [], None
    while True:
        query: dict[str, Any] = {"order": "newest", "limit": 2} | (
            {"after": cursor} if cursor else {}
        )
        page = listed(client, **query)
        pages.append([item["id"] for item in page["items"]])
        cursor = page["next"]
        if cursor is None:
            break
    assert pages == [ids[:2:-1], ids[2:0:-1], ids[:1]]
    bad = client.get("/v1/records", params={"order": "sideways"})
    assert bad.status_code == 422


def test_a_selection_by_ids_is_counted_then_retried_and_audited(harness, downstream):
    numbers = ["BAD-1", "BAD-2", "BAD-3", "OK-1"]
    rt, ids = shipments(harness, downstream, numbers)
    chosen = [ids[0], ids[2], ids[3]]  # two refused, one done (not retried)
    client = harness.start_intake()
    assert found(client, id=chosen) == chosen

    dry = client.post("/v1/records/retry", json={"ids": chosen, "dry_run": True})
    assert dry.status_code == 200, dry.text
    assert dry.json() | {"enqueued": None} == {
        "dry_run": True,
        "matched": 3,
        "retried": 2,
        "skipped_status": 1,
        "skipped_in_flight": 0,
        "enqueued": None,
        "deferred": None,
        "skipped_unknown_line": 0,
    }
    with rt.journal.reading() as conn:
        assert audit.newest(conn, limit=10) == []  # a dry run writes nothing

    real = client.post("/v1/records/retry", json={"ids": chosen, "reason": "sku added"})
    assert real.status_code == 200, real.text
    assert (real.json()["retried"], real.json()["matched"]) == (2, 3)
    statuses = {item["id"]: item["status"] for item in listed(client, line="shipment")["items"]}
    assert statuses == {ids[0]: "enqueued", ids[1]: "failed", ids[2]: "enqueued", ids[3]: "done"}
    with rt.journal.reading() as conn:
        (row,) = audit.newest(conn, limit=10)
    assert (row.action, row.reason) == (audit.Action.RETRY, "sku added")
    assert row.params == {"ids": chosen}
    assert row.result is not None
    assert row.result["acted"] == 2


def test_a_selection_of_too_many_ids_is_a_422(harness):
    harness.runtime()
    client = harness.start_intake()
    ids = [f"{n:026d}" for n in range(1001)]
    answer = client.post("/v1/records/cancel", json={"ids": ids, "reason": "too many"})
    assert answer.status_code == 422
    assert "ids" in answer.text
    query = urllib.parse.urlencode([("id", i) for i in ids[:3]])
    assert client.get(f"/v1/records?{query}").json()["items"] == []
