"""Is a worker's consumer stalled? The decision each heartbeat makes, over values."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.observe.stall import ConsumerSample, StallWatch, watch

STALL_AFTER_S = 30.0
# A free slot, work waiting, nothing taken yet.
STARVED = ConsumerSample(taken=0, consuming=True, held=0, slots=4, queue_depth=5)


def checks(samples: list[ConsumerSample], *, every_s: float = 5.0) -> tuple[StallWatch, float]:
    """The watch after one check per sample, `every_s` apart from time 0; and the last time."""
    seen: StallWatch | None = None
    now_s = 0.0
    for n, sample in enumerate(samples):
        now_s = n * every_s
        seen = watch(seen, sample, now_s=now_s)
    assert seen is not None
    return seen, now_s


def stalled(samples: list[ConsumerSample], *, every_s: float = 5.0) -> bool:
    seen, now_s = checks(samples, every_s=every_s)
    return seen.is_stalled(now_s=now_s, stall_after_s=STALL_AFTER_S)


def test_a_free_slot_and_waiting_work_with_nothing_taken_is_stalled_after_the_threshold() -> None:
    # Checks at 0, 5, ... 25 s: starved 25 s, not yet; at 30 s it is.
    assert not stalled([STARVED] * 6)
    assert stalled([STARVED] * 7)


def test_a_cancelled_consumer_is_stalled_by_the_same_rule() -> None:
    cancelled = replace(STARVED, consuming=False)
    assert not stalled([cancelled] * 6)
    assert stalled([cancelled] * 7)


def test_a_worker_whose_slots_are_all_busy_with_long_tasks_is_not_stalled() -> None:
    busy = replace(STARVED, held=4)
    assert not stalled([busy] * 1000)


def test_a_worker_holding_more_than_its_slots_is_busy_too() -> None:
    # Celery lowers the prefetch count for a while after a reconnect, below what it holds.
    assert not stalled([replace(STARVED, held=3, slots=2)] * 100)


def test_a_worker_that_is_stopping_is_never_stalled_and_its_clock_starts_again() -> None:
    # Its shutdown cancels the consumer, or holds the event loop, while tasks finish.
    stopping = [replace(STARVED, stopping=True), replace(STARVED, consuming=False, stopping=True)]
    assert not stalled(stopping * 100)
    # Its starved time before it began stopping is not carried over.
    assert not stalled([*[STARVED] * 6, *stopping, *[STARVED] * 5])


@pytest.mark.parametrize("depth", [0, None])
def test_an_empty_or_unknown_queue_starves_nobody(depth: int | None) -> None:
    assert not stalled([replace(STARVED, queue_depth=depth)] * 100)


def test_taking_messages_restarts_the_clock() -> None:
    taking = [replace(STARVED, taken=n) for n in range(100)]
    assert not stalled(taking)
    # It took its last message by the 5th check (20 s): 30 s after that, it is stalled.
    after = [*taking[:5], *[taking[4]] * 5]
    assert not stalled(after)
    assert stalled([*after, taking[4]])


def test_the_clock_starts_when_a_slot_frees_not_at_the_last_message_taken() -> None:
    # Busy for a long time with one message taken long ago; then a slot frees.
    busy = [replace(STARVED, held=4)] * 50
    assert not stalled([*busy, *[STARVED] * 6])
    assert stalled([*busy, *[STARVED] * 7])


def test_the_clock_starts_when_work_arrives_not_when_the_queue_was_last_empty() -> None:
    idle = [replace(STARVED, queue_depth=0)] * 50
    assert not stalled([*idle, *[STARVED] * 6])
    assert stalled([*idle, *[STARVED] * 7])


def test_a_stalled_consumer_is_restarted_once_per_threshold_and_stays_stalled_until_it_takes() -> (
    None
):
    seen, now_s = checks([STARVED] * 7)
    assert seen.restart_due(now_s=now_s, stall_after_s=STALL_AFTER_S)
    seen = seen.restarted(now_s=now_s)
    assert seen.restarts == 1
    for _ in range(5):
        now_s += 5
        seen = watch(seen, STARVED, now_s=now_s)
        assert seen.is_stalled(now_s=now_s, stall_after_s=STALL_AFTER_S)
        assert not seen.restart_due(now_s=now_s, stall_after_s=STALL_AFTER_S)
    now_s += 5
    seen = watch(seen, STARVED, now_s=now_s)
    assert seen.restart_due(now_s=now_s, stall_after_s=STALL_AFTER_S)
    assert seen.restarted(now_s=now_s).restarts == 2

    # It takes something: live again, and a later stall starts from no restarts.
    now_s += 5
    seen = watch(seen, replace(STARVED, taken=1), now_s=now_s)
    assert not seen.is_stalled(now_s=now_s, stall_after_s=STALL_AFTER_S)
    assert (seen.restarts, seen.restarted_at_s) == (0, None)


def test_a_restart_its_event_loop_never_runs_makes_the_worker_exit_one_threshold_later() -> None:
    seen, now_s = checks([STARVED] * 7)
    asked_s = now_s  # the restart handed to the loop at 30 s, never run
    seen = seen.restarted(now_s=now_s)
    for _ in range(5):
        now_s += 5
        seen = watch(seen, STARVED, now_s=now_s)
        assert not seen.exit_due(
            now_s=now_s, stall_after_s=STALL_AFTER_S, restart_waiting_since_s=asked_s
        )
    now_s += 5
    seen = watch(seen, STARVED, now_s=now_s)
    assert seen.exit_due(now_s=now_s, stall_after_s=STALL_AFTER_S, restart_waiting_since_s=asked_s)
    # Its restarts ran: a stall that lasts is restarted again, not a reason to exit.
    assert not seen.exit_due(now_s=now_s, stall_after_s=STALL_AFTER_S, restart_waiting_since_s=None)


@pytest.mark.parametrize(
    "sample",
    [
        replace(STARVED, taken=1),  # the loop took a message: it runs
        replace(STARVED, held=4),  # busy, such as a solo worker running a task on its loop
        replace(STARVED, stopping=True),  # its shutdown holds the loop
        replace(STARVED, queue_depth=0),
    ],
)
def test_a_waiting_restart_makes_no_exit_due_once_the_consumer_is_not_stalled(
    sample: ConsumerSample,
) -> None:
    seen, now_s = checks([STARVED] * 7)
    seen = watch(seen.restarted(now_s=now_s), sample, now_s=now_s + 100)
    assert not seen.exit_due(
        now_s=now_s + 100, stall_after_s=STALL_AFTER_S, restart_waiting_since_s=0
    )
