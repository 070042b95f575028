"""A worker process's delivery slots: a record is claimed only when a thread is free."""

from __future__ import annotations

import threading
import time

from app.delivery.slots import DeliverySlots


def test_slots_are_taken_as_many_as_are_free_and_given_back_one_by_one() -> None:
    slots = DeliverySlots(4)
    assert slots.take(3, timeout_s=1) == 3
    assert slots.take(3, timeout_s=1) == 1  # only one was left
    assert slots.take(1, timeout_s=0.05) == 0  # none free: nothing taken in time
    slots.give()
    slots.give()
    assert slots.take(5, timeout_s=1) == 2
    slots.give(10)
    assert slots.take(10, timeout_s=1) == 4  # never more than there are


def test_a_taker_waits_for_a_slot_given_back_by_another_thread() -> None:
    slots = DeliverySlots(1)
    assert slots.take(1, timeout_s=1) == 1
    threading.Timer(0.1, slots.give).start()
    began = time.monotonic()
    assert slots.take(1, timeout_s=5) == 1
    assert time.monotonic() - began < 5
