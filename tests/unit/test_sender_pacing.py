"""A sender's intake rate on a line: its pacer, made the first time the sender is seen on
a paced line, and the order of a request's turns (its sender's, then its line's)."""

from __future__ import annotations

import asyncio

import pytest

from app.config.settings import load_settings
from app.errors import RateLimited
from app.intake.pacing import IntakePacers, pacers_for
from app.lines import LineRegistry


class Clock:
    """A clock that moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def intake_pacers(monkeypatch: pytest.MonkeyPatch, clock: Clock, **rates: str) -> IntakePacers:
    """The pacers of the default lines with `rates` set, as `PIPELINE_LINES__...` would."""
    for name, value in rates.items():
        line, _, setting = name.partition("__")
        monkeypatch.setenv(f"PIPELINE_LINES__{line.upper()}__{setting.upper()}", value)
    lines = LineRegistry.from_settings(load_settings())
    return pacers_for(lines, in_flight_limit=256, clock=clock)


def test_a_senders_pacer_is_made_when_it_is_first_seen_and_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pacers = intake_pacers(monkeypatch, Clock(), status__sender_intake_rate="20")
    assert pacers.senders == {}
    assert pacers.lines == {}  # no line-wide rate: no line pacer
    shop_a = pacers.for_sender("status", "shop-a")
    assert shop_a is not None
    assert pacers.for_sender("status", "shop-a") is shop_a
    shop_b = pacers.for_sender("status", "shop-b")
    assert shop_b is not None
    assert shop_b is not shop_a
    assert set(pacers.senders) == {("status", "shop-a"), ("status", "shop-b")}
    # Like a line's pacer: its rate, two of them at once (0.1 s worth), the line's share.
    assert (shop_a.interval, shop_a.max_waiting) == (1 / 20, 64)
    assert shop_a.tolerance == pytest.approx(1 / 20)


def test_a_line_without_a_sender_rate_makes_no_sender_pacer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pacers = intake_pacers(monkeypatch, Clock(), status__intake_rate="20")
    assert pacers.for_sender("order", "shop-a") is None
    assert pacers.for_sender("status", "shop-a") is None
    assert pacers.senders == {}
    assert list(pacers.lines) == ["status"]


def test_one_senders_flood_is_refused_while_another_sender_is_admitted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> None:
        # One request every two seconds from each sender, on a clock that stays.
        pacers = intake_pacers(monkeypatch, Clock(), status__sender_intake_rate="0.5")
        await pacers.admit("status", "shop-a")  # its first turn: at once
        with pytest.raises(RateLimited) as refused:  # its next is past `MAX_WAIT_S`
            await pacers.admit("status", "shop-a")
        assert refused.value.code == "rate_limited"
        assert refused.value.retry_after_s >= 1
        await pacers.admit("status", "shop-b")  # another sender: its own first turn
        await pacers.admit("order", "shop-a")  # another line: not paced

    asyncio.run(scenario())


def test_a_request_takes_its_senders_turn_then_its_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    pacers = intake_pacers(
        monkeypatch, clock, status__intake_rate="0.5", status__sender_intake_rate="0.5"
    )

    async def scenario() -> None:
        await pacers.admit("status", "shop-a")
        line = pacers.lines["status"]
        shop_a = pacers.for_sender("status", "shop-a")
        shop_b = pacers.for_sender("status", "shop-b")
        assert shop_a is not None
        assert shop_b is not None
        # Shop A's first request took a turn of its own pacer and one of the line's.
        assert (shop_a.due, line.due) == (102.0, 102.0)
        # Shop B has a turn of its own, but the line's next is two seconds away: refused by
        # the line, after its own turn was taken.
        with pytest.raises(RateLimited):
            await pacers.admit("status", "shop-b")
        assert (shop_b.due, line.due) == (102.0, 102.0)
        # Refused by its own pacer, shop A takes no turn of the line's.
        with pytest.raises(RateLimited):
            await pacers.admit("status", "shop-a")
        assert (shop_a.due, line.due) == (102.0, 102.0)

    asyncio.run(scenario())
