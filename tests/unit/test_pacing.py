"""A line's intake rate: the pacer's turns, on a clock the test moves, and its bounds."""

from __future__ import annotations

import asyncio

import pytest

from app.config.settings import load_settings
from app.errors import RateLimited
from app.intake.pacing import Pacer, pacers_for
from app.lines import LineRegistry


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_turns_are_one_interval_apart_and_a_quiet_spell_resets_them():
    clock = Clock()
    pacer = Pacer(10, tick_s=0, clock=clock)
    assert [round(pacer.reserve(), 3) for _ in range(4)] == [0.0, 0.1, 0.2, 0.3]
    clock.now += 0.25  # the fourth turn is now 0.05 s away; the fifth is next after it
    assert round(pacer.reserve(), 3) == 0.15
    clock.now += 10
    assert pacer.reserve() == 0.0


def test_a_burst_goes_at_once_then_the_rate_holds():
    clock = Clock()
    pacer = Pacer(10, burst=3, tick_s=0, clock=clock)
    assert [round(pacer.reserve(), 3) for _ in range(5)] == [0.0, 0.0, 0.0, 0.1, 0.2]


def test_a_turn_further_than_the_longest_wait_is_refused_and_not_taken():
    clock = Clock()
    pacer = Pacer(10, max_wait_s=0.25, tick_s=0, clock=clock)
    assert [round(pacer.reserve(), 3) for _ in range(3)] == [0.0, 0.1, 0.2]
    for _ in range(3):  # refusals take no turn: the next one is still 0.3 s away
        with pytest.raises(RateLimited) as refused:
            pacer.reserve()
        assert refused.value.retry_after_s == 1
        assert refused.value.code == "rate_limited"
    clock.now += 0.1
    assert round(pacer.reserve(), 3) == 0.2


def test_waits_end_on_a_tick_so_turns_within_one_tick_go_together():
    clock = Clock()
    clock.now = 100.01
    pacer = Pacer(100, tick_s=0.05, clock=clock)  # turns 10 ms apart
    waits = [pacer.reserve() for _ in range(7)]
    assert waits[0] == 0.0  # the first turn is now: no wait, no tick
    # Turns at 100.02, .03, .04 and .05 go at 100.05; those at .06 and .07 at 100.10.
    assert [round(clock.now + w, 3) for w in waits[1:]] == [100.05] * 4 + [100.1] * 2


def test_no_more_than_max_waiting_wait_at_once():
    async def scenario() -> None:
        pacer = Pacer(10, max_waiting=2, tick_s=0, clock=Clock())  # a clock that stays
        tasks = [asyncio.ensure_future(pacer.admit()) for _ in range(5)]
        await asyncio.sleep(0)  # each task runs to its turn, its wait or its refusal
        # The first goes at once, two wait their turns, the other two find the room full.
        assert [t.done() for t in tasks] == [True, False, False, True, True]
        assert tasks[0].result() is None
        assert all(isinstance(t.exception(), RateLimited) for t in tasks[3:])
        assert pacer.waiting == 2
        for waiting in tasks[1:3]:  # a caller gone while waiting frees its place
            waiting.cancel()
        await asyncio.gather(*tasks[1:3], return_exceptions=True)
        assert pacer.waiting == 0

    asyncio.run(scenario())


def test_only_lines_with_an_intake_rate_are_paced(monkeypatch):
    monkeypatch.setenv("PIPELINE_LINES__STATUS__INTAKE_RATE", "250")
    pacers = pacers_for(LineRegistry.from_settings(load_settings()), in_flight_limit=256)
    assert list(pacers.lines) == ["status"]
    status = pacers.lines["status"]
    assert (status.interval, status.max_waiting) == (1 / 250, 64)
    assert status.tolerance == pytest.approx(24 / 250)  # a burst of 25: 0.1 s worth


def test_a_pacer_refuses_settings_that_would_never_admit():
    for kwargs in ({"rate": 0}, {"rate": 1, "burst": 0}, {"rate": 1, "max_waiting": 0}):
        with pytest.raises(ValueError, match="rate above 0"):
            Pacer(**kwargs)
