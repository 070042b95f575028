"""The circuit's rules, on a real Redis: when it opens, who probes, what closes it."""

from __future__ import annotations

import time

import pytest

from app.config.line_settings import LineSettings
from app.delivery.circuit import (
    RAMP_S,
    Admission,
    Change,
    Health,
    Outcome,
    State,
    Waiting,
    counts_against,
    health_of,
)
from tests.support.circuits import CircuitsNow

pytestmark = pytest.mark.journal_independent

SETTINGS = LineSettings(
    downstream_url="http://127.0.0.1:9/in", circuit_min_attempts=10, circuit_probe_interval_s=1
)


def test_what_counts_against_the_downstream() -> None:
    assert counts_against(None)  # a timeout, no connection
    assert counts_against(503)
    assert counts_against(429)
    assert not counts_against(404)
    assert not counts_against(409)


def test_only_a_delivery_says_up_and_a_refusal_says_nothing() -> None:
    assert health_of(delivered=True, http_status=200) is Health.UP
    assert health_of(delivered=True, http_status=409) is Health.UP  # a line that says so
    assert health_of(delivered=False, http_status=None) is Health.DOWN
    assert health_of(delivered=False, http_status=503) is Health.DOWN
    assert health_of(delivered=False, http_status=429) is Health.DOWN
    assert health_of(delivered=False, http_status=422) is Health.UNSAID
    assert health_of(delivered=False, http_status=409) is Health.UNSAID


def test_a_refusal_is_not_counted_and_closes_no_circuit_and_frees_the_probe(harness):
    circuits = CircuitsNow(harness.settings().redis_url)
    for _ in range(20):  # closed: refusals count neither way
        assert circuits.count("r", SETTINGS, health=Health.UNSAID).counted == 0
    for _ in range(9):
        circuits.count("r", SETTINGS, health=Health.DOWN)
    opened = circuits.count("r", SETTINGS, health=Health.DOWN)
    assert (opened.change, opened.counted) == (Change.OPENED, 10)
    time.sleep(1.1)  # the probe interval
    assert (
        circuits.admit("r", SETTINGS, owner="x", probe_lifetime_s=30).admission is Admission.PROBE
    )
    refused = circuits.count("r", SETTINGS, health=Health.UNSAID, owner="x")
    assert (refused.change, refused.state) == (Change.NONE, State.OPEN)
    assert circuits.state("r").state is State.OPEN
    # It said nothing of the downstream: the next probe goes at once.
    assert (
        circuits.admit("r", SETTINGS, owner="y", probe_lifetime_s=30).admission is Admission.PROBE
    )
    closed = circuits.count("r", SETTINGS, health=Health.UP, owner="y")
    assert (closed.change, closed.state) == (Change.CLOSED, State.CLOSED)


def test_it_opens_when_most_of_enough_deliveries_failed_and_a_success_closes_it(harness):
    circuits = CircuitsNow(harness.settings().redis_url)
    for _ in range(5):
        assert circuits.count("a", SETTINGS, health=Health.UP).change is Change.NONE
    for _ in range(5):  # half failed: not most
        assert circuits.count("a", SETTINGS, health=Health.DOWN).state is State.CLOSED
    opened = circuits.count("a", SETTINGS, health=Health.DOWN)  # 6 of 11
    assert (opened.change, opened.state, opened.failed, opened.counted) == (
        Change.OPENED,
        State.OPEN,
        6,
        11,
    )
    assert circuits.state("a").state is State.OPEN
    assert circuits.state("b").state is State.CLOSED  # lines are apart
    closed = circuits.count("a", SETTINGS, health=Health.UP)
    assert (closed.change, closed.state) == (Change.CLOSED, State.CLOSED)
    # The window starts again empty: five failures are not enough to open it again.
    for _ in range(5):
        assert circuits.count("a", SETTINGS, health=Health.DOWN).state is State.CLOSED


def test_too_few_deliveries_never_open_it(harness):
    circuits = CircuitsNow(harness.settings().redis_url)
    for _ in range(9):
        assert circuits.count("few", SETTINGS, health=Health.DOWN).state is State.CLOSED


def test_one_probe_at_a_time_and_the_next_one_after_the_interval(harness):
    circuits = CircuitsNow(harness.settings().redis_url)
    for _ in range(10):
        circuits.count("p", SETTINGS, health=Health.DOWN)
    assert circuits.admit("p", SETTINGS, owner="x", probe_lifetime_s=30).admission is Admission.WAIT
    time.sleep(1.1)  # the probe interval
    assert (
        circuits.admit("p", SETTINGS, owner="x", probe_lifetime_s=30).admission is Admission.PROBE
    )
    assert circuits.state("p").probing
    assert circuits.admit("p", SETTINGS, owner="y", probe_lifetime_s=30).admission is Admission.WAIT
    # The probe failed: no other goes before another interval.
    assert circuits.count("p", SETTINGS, health=Health.DOWN, owner="x").state is State.OPEN
    assert not circuits.state("p").probing
    assert circuits.admit("p", SETTINGS, owner="y", probe_lifetime_s=30).admission is Admission.WAIT
    time.sleep(1.1)
    assert (
        circuits.admit("p", SETTINGS, owner="y", probe_lifetime_s=30).admission is Admission.PROBE
    )
    # A probe that never went out (its record was not claimed) lets the next one go.
    circuits.drop_probe("p", "y")
    assert (
        circuits.admit("p", SETTINGS, owner="z", probe_lifetime_s=30).admission is Admission.PROBE
    )
    # A probe whose worker died lapses after its lifetime.
    circuits.drop_probe("p", "z")
    assert (
        circuits.admit("p", SETTINGS, owner="dead", probe_lifetime_s=0.5).admission
        is Admission.PROBE
    )
    time.sleep(0.6)
    assert (
        circuits.admit("p", SETTINGS, owner="next", probe_lifetime_s=30).admission
        is Admission.PROBE
    )


def test_after_a_close_deliveries_come_back_on_a_ramp(harness):
    circuits = CircuitsNow(harness.settings().redis_url)
    for _ in range(10):
        circuits.count("ramp", SETTINGS, health=Health.DOWN)
    assert circuits.state("ramp").state is State.OPEN
    closed = circuits.count("ramp", SETTINGS, health=Health.UP)
    assert closed.change is Change.CLOSED

    def admitted_now() -> list[Admission]:
        return [
            circuits.admit("ramp", SETTINGS, owner="", probe_lifetime_s=30).admission
            for _ in range(3 * SETTINGS.circuit_min_attempts)
        ]

    # The first second: the line's share (circuit_min_attempts), then the others wait.
    first = admitted_now()
    assert first.count(Admission.GO) == SETTINGS.circuit_min_attempts, first
    assert set(first[SETTINGS.circuit_min_attempts :]) == {Admission.WAIT}
    waiting = circuits.admit("ramp", SETTINGS, owner="", probe_lifetime_s=30)
    assert 0 < waiting.wait_s <= 1
    time.sleep(1.05)  # the ramp's next second
    second = admitted_now()
    assert second.count(Admission.GO) == 2 * SETTINGS.circuit_min_attempts, second
    # Opened again during the ramp, it stays open (the ramp's lifetime goes with it).
    for _ in range(10):
        circuits.count("ramp", SETTINGS, health=Health.DOWN)
    assert circuits.state("ramp").state is State.OPEN
    time.sleep(RAMP_S + 0.5)  # past the ramp's lifetime: a key that lapsed would close it
    assert circuits.state("ramp").state is State.OPEN


def test_a_retry_after_holds_the_line_and_each_wait_says_what_it_waits_for(harness):
    circuits = CircuitsNow(harness.settings().redis_url)
    asked = Outcome(health=Health.DOWN, retry_after_s=2)
    counted = circuits.count_all("held", SETTINGS, [Outcome(health=Health.UP), asked])
    assert counted.state is State.CLOSED
    # Closed, yet nothing goes until the downstream's wait has passed.
    held = circuits.admit("held", SETTINGS, owner="x", probe_lifetime_s=30, want=5)
    assert (held.admission, held.granted, held.waiting) == (Admission.WAIT, 0, Waiting.HOLD)
    assert 1 < held.wait_s <= 2
    time.sleep(held.wait_s + 0.05)
    free = circuits.admit("held", SETTINGS, owner="x", probe_lifetime_s=30, want=5)
    assert (free.admission, free.granted) == (Admission.GO, 5)
    # Open: the others wait for its next probe.
    for _ in range(10):
        circuits.count("open", SETTINGS, health=Health.DOWN)
    probe = circuits.admit("open", SETTINGS, owner="p", probe_lifetime_s=30, want=5)
    assert probe.admission is Admission.WAIT
    assert probe.waiting is Waiting.OPEN
