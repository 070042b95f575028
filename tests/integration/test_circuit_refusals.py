"""A record the downstream refuses for its own sake (a 4xx) says nothing of the downstream's
health. During an outage it neither closes the circuit (sending every record that came due
into the outage) nor has its own attempt given back; the records that only met the outage
keep theirs, and none of them dies."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.downstream import Gauged, post_records
from tests.support.processes import wait_for
from tests.support.recorder import Received

pytestmark = [pytest.mark.journal_independent, pytest.mark.long]

OUTAGE_S = 30
PROBE_INTERVAL_S = 2


class OutageWithRefusals(Gauged):
    """Down (503) while `down`; a record whose business number starts with `BAD` is
    refused (422) whatever the downstream's health: its own fault."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True

    def answer(self, method: str, received: Received) -> int:
        super().answer(method, received)
        body: Any = received.body
        if isinstance(body, dict) and str(body.get("business_no", "")).startswith("BAD"):
            return 422
        return 503 if self.down else 200


def _circuit_state(client) -> str:
    (row,) = [r for r in client.get("/v1/lines").json()["lines"] if r["line"] == "shipment"]
    return row["circuit"]["state"]


def test_refused_records_during_an_outage_close_no_circuit_and_kill_no_other_record(harness):
    downstream = OutageWithRefusals().start()
    try:
        harness.configure(
            lines__shipment__downstream_url=f"{downstream.url}/in",
            lines__shipment__max_attempts="2",
            lines__shipment__backoff_initial_s="0.2",
            lines__shipment__backoff_max_s="1",
            lines__shipment__circuit_probe_interval_s=str(PROBE_INTERVAL_S),
            sweep_interval_seconds="1",
        )
        client = harness.start_intake()
        harness.start_worker("shipment", pool=None, concurrency=None)
        harness.start_beat()
        bad = post_records(client, "shipment", 2, "BAD")
        harness.wait_until_final(bad, timeout_s=30)  # refused twice each: dead
        down_since = time.monotonic()
        good = post_records(client, "shipment", 20, "GOOD")
        wait_for(lambda: _circuit_state(client) == "open", timeout_s=30, what="the circuit")
        # An operator retries the refused records during the outage, as one would who
        # thinks they failed for the outage's sake: each goes alone, and may be the probe.
        closed_seen = False
        while time.monotonic() - down_since < OUTAGE_S:
            for record_id in bad:
                client.post(f"/v1/records/{record_id}/retry")  # 409 while it waits: fine
            closed_seen = closed_seen or _circuit_state(client) == "closed"
            time.sleep(PROBE_INTERVAL_S / 2)  # an operator's pace, not a wait for a state
        downstream.down = False
        final = harness.wait_until_final(good | bad, timeout_s=120)

        statuses = {record_id: final[record_id].status.value for record_id in good}
        assert set(statuses.values()) == {"done"}, statuses
        # The refusals spent their own attempts, and died of them again.
        assert {final[record_id].status.value for record_id in bad} == {"dead"}
        assert not closed_seen, "a refusal closed the circuit during the outage"
    finally:
        downstream.stop()
