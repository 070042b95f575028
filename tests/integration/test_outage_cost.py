"""An outage costs the journal little: while an HTTP-sink line's circuit is open, the
records that wait for its downstream stay in the journal instead of each making a round
through the queue, a worker and a journal write every probe interval. One goes at a time,
as the next probe's candidate; the others go once the circuit closes."""

from __future__ import annotations

import pytest

from app.clock import utcnow
from app.delivery.circuit import Health, Outcome
from app.journal.models import RecordStatus
from tests.support.circuits import CircuitsNow
from tests.support.downstream import post_records
from tests.support.harness import Harness
from tests.support.messages import empty_queue
from tests.support.processes import free_port, wait_for

pytestmark = pytest.mark.journal

RECORDS = 30


def test_an_open_circuit_keeps_its_waiting_records_in_the_journal_but_one(
    harness: Harness,
) -> None:
    harness.configure(
        # Nothing answers there; no worker runs: the test runs the engine and the sweeper.
        lines__shipment__downstream_url=f"http://127.0.0.1:{free_port()}/in",
        lines__shipment__circuit_probe_interval_s="1",
    )
    rt = harness.runtime()
    line = rt.lines.get("shipment")
    circuits = CircuitsNow(harness.settings().redis_url)
    client = harness.start_intake()
    ids = post_records(client, "shipment", RECORDS, "OUT")
    empty_queue(rt.redis, line.queue)  # as if a worker had taken their messages
    down = [Outcome(health=Health.DOWN)] * (line.settings.circuit_min_attempts + 1)
    assert circuits.count_all("shipment", line.settings, down).state.value == "open"
    # A worker runs them: none starts, each waits for the circuit, no attempt spent.
    assert all(result.record is None for result in rt.attempts.run(sorted(ids), line=line))
    waiting = [r for r in harness.records() if r.id in ids]
    assert {(r.status, r.attempts) for r in waiting} == {(RecordStatus.FAILED, 0)}

    def all_due() -> bool:
        return all(r.next_attempt_at and r.next_attempt_at <= utcnow() for r in harness.records())

    wait_for(all_due, timeout_s=15, what="the waiting records to come due")
    # Before, each sweep pushed every due record back on the queue (30 here), for a
    # worker to postpone again: round after round for the whole outage.
    first = rt.sweeper.sweep(now=utcnow()).enqueued.get("shipment", 0)
    assert first == 1
    assert sum(1 for r in harness.records() if r.status is RecordStatus.ENQUEUED) == 1
    # It is the next probe: while it is out, nothing more goes.
    verdict = circuits.admit("shipment", line.settings, owner="lost", probe_lifetime_s=1)
    assert verdict.admission.value == "probe"
    assert rt.sweeper.sweep(now=utcnow()).enqueued.get("shipment", 0) == 0
    # A probe whose worker died (its outcome never counted) lapses after its lifetime:
    # the next candidate goes, and the line is never stranded behind it.
    wait_for(lambda: not circuits.state("shipment").probing, timeout_s=10, what="the lapse")
    assert rt.sweeper.sweep(now=utcnow()).enqueued.get("shipment", 0) == 1
    wait_for(
        lambda: (
            circuits.admit(
                "shipment", line.settings, owner="probe", probe_lifetime_s=30
            ).admission.value
            == "probe"
        ),
        timeout_s=10,
        what="the next probe",
    )
    assert rt.sweeper.sweep(now=utcnow()).enqueued.get("shipment", 0) == 0

    # The probe is delivered: the circuit closes, and the rest go.
    up = [Outcome(health=Health.UP, owner="probe")]
    assert circuits.count_all("shipment", line.settings, up).state.value == "closed"
    assert rt.sweeper.sweep(now=utcnow()).enqueued.get("shipment", 0) == RECORDS - 2
    assert {r.status for r in harness.records()} == {RecordStatus.ENQUEUED}
