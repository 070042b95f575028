"""A line's delivery slots in a worker process: messages that wait for them are served in
the order they came (one arriving as a slot comes free does not take it from one that
waited), and a waiter that gives up, or is cancelled, holds none."""

from __future__ import annotations

import asyncio

from app.delivery.engine import _Slots


def test_a_slot_that_comes_free_goes_to_the_message_that_waited_first() -> None:
    async def scenario() -> list[str]:
        slots = _Slots(1)
        order: list[str] = []
        assert await slots.take(4, timeout_s=1) == 1  # the one slot is held

        async def message(name: str) -> None:
            if await slots.take(1, timeout_s=5):
                order.append(name)

        first = asyncio.ensure_future(message("first"))
        await asyncio.sleep(0)  # it waits
        slots.give()  # ... and a late one asks at the same moment
        late = asyncio.ensure_future(message("late"))
        await asyncio.sleep(0)
        await first
        assert order == ["first"]
        slots.give()
        await late
        return order

    assert asyncio.run(scenario()) == ["first", "late"]


def test_a_waiter_that_gives_up_or_is_cancelled_holds_no_slot() -> None:
    async def scenario() -> int:
        slots = _Slots(2)
        assert await slots.take(2, timeout_s=1) == 2
        assert await slots.take(1, timeout_s=0.01) == 0  # none came free in time
        waiting = asyncio.ensure_future(slots.take(2, timeout_s=5))
        await asyncio.sleep(0)
        slots.give(2)  # handed to the waiter ...
        waiting.cancel()  # ... which is cancelled before it could run
        await asyncio.gather(waiting, return_exceptions=True)
        return slots.free

    assert asyncio.run(scenario()) == 2
