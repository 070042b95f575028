"""A downstream's `Retry-After` on a 429 or 503 is honoured: the record's next attempt is
not before it, whatever its backoff would have said."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.downstream import post_records
from tests.support.processes import wait_for
from tests.support.recorder import Received, _SmallServer

pytestmark = pytest.mark.journal_independent

WAIT_S = 4


class AsksToWait(_SmallServer):
    """Answers each record's first delivery 429 (503 for the odd ones) with
    `Retry-After: WAIT_S`, and every later one 200."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def answer(self, method: str, received: Received) -> int:
        key = received.headers.get("Idempotency-Key", "")
        with self.lock:
            first = key not in self.seen
            self.seen.add(key)
        if not first:
            return 200
        return 503 if received.body["business_no"].endswith(("1", "3")) else 429

    def headers_for(self, received: Received) -> dict[str, str]:
        return {"Retry-After": str(WAIT_S)} if received.answered != 200 else {}


def start_line(harness, downstream: _SmallServer) -> Any:
    """The shipment line toward `downstream`, with short backoffs and sweeps: its intake's
    client, its worker and beat started."""
    harness.configure(
        lines__shipment__downstream_url=f"{downstream.url}/in",
        lines__shipment__backoff_initial_s="0.2",
        lines__shipment__backoff_max_s="0.5",
        sweep_interval_seconds="0.5",
    )
    client = harness.start_intake()
    harness.start_worker("shipment", pool=None, concurrency=None)
    harness.start_beat()
    return client


def test_a_record_asked_to_wait_is_not_tried_again_before_the_wait(harness):
    downstream = AsksToWait().start()
    try:
        client = start_line(harness, downstream)
        ids = post_records(client, "shipment", 4, "WAIT")
        final = harness.wait_until_final(ids, timeout_s=60)
        assert {r.status.value for r in final.values()} == {"done"}
        assert {r.attempts for r in final.values()} == {2}
        by_key: dict[str, list[Received]] = {}
        for received in downstream.snapshot():
            by_key.setdefault(received.headers["Idempotency-Key"], []).append(received)
        for first, second in by_key.values():
            assert first.answered in (429, 503)
            assert second.at_s - first.at_s >= WAIT_S, (first.answered, second.at_s - first.at_s)
        history = client.get(f"/v1/records/{next(iter(ids))}").json()["attempt_history"]
        assert f"Retry-After {WAIT_S} s" in history[0]["error_message"]
    finally:
        downstream.stop()


class AsksOnce(_SmallServer):
    """Answers the first delivery it ever gets 429 with `Retry-After: WAIT_S`, every other
    one 200."""

    def answer(self, method: str, received: Received) -> int:
        with self.lock:
            first = not self.received
        return 429 if first else 200

    def headers_for(self, received: Received) -> dict[str, str]:
        return {"Retry-After": str(WAIT_S)} if received.answered == 429 else {}


def test_the_whole_line_waits_out_a_retry_after_and_its_records_show_it(harness):
    """One 429 with `Retry-After` holds every delivery of the line, not only its record's:
    records posted meanwhile reach the downstream only once the wait has passed, spend no
    attempt waiting, and show meanwhile as waiting for their downstream."""
    downstream = AsksOnce().start()
    try:
        client = start_line(harness, downstream)
        (first,) = post_records(client, "shipment", 1, "FIRST")
        wait_for(
            lambda: client.get(f"/v1/records/{first}").json()["status"] == "failed",
            timeout_s=30,
            what="the first delivery's 429 to be recorded",
        )
        later = post_records(client, "shipment", 5, "LATER")
        shown: dict[str, object] = {}

        def held() -> bool:
            views = [client.get(f"/v1/records/{i}").json() for i in later]
            shown.update({view["id"]: view for view in views})
            return all(view["waiting_for"] == "downstream" for view in views)

        wait_for(held, timeout_s=WAIT_S, what="the later records to wait for their downstream")
        final = harness.wait_until_final({first, *later}, timeout_s=60)

        assert {r.status.value for r in final.values()} == {"done"}
        assert final[first].attempts == 2
        # Held back, the later records spent no attempt waiting.
        assert {final[i].attempts for i in later} == {1}
        asked, *after = downstream.snapshot()
        assert asked.answered == 429
        assert len(after) == 6
        # Nothing of the line went out before the wait had passed.
        assert min(r.at_s for r in after) - asked.at_s >= WAIT_S - 0.05
        assert all("Retry-After" in str(view["last_error"]) for view in shown.values())
    finally:
        downstream.stop()
