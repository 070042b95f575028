"""A downstream's `Retry-After` on a 429 or 503 is honoured: the record's next attempt is
not before it, whatever its backoff would have said."""

from __future__ import annotations

import pytest

from tests.support.downstream import post_records
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


def test_a_record_asked_to_wait_is_not_tried_again_before_the_wait(harness):
    downstream = AsksToWait().start()
    try:
        harness.configure(
            lines__shipment__downstream_url=f"{downstream.url}/in",
            lines__shipment__backoff_initial_s="0.2",
            lines__shipment__backoff_max_s="0.5",
            sweep_interval_seconds="0.5",
        )
        client = harness.start_intake()
        harness.start_worker("shipment", pool=None, concurrency=None)
        harness.start_beat()
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
