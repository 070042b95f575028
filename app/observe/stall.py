"""Is a worker's consumer stalled? A pure decision over what the worker sees of its consumer
of one line at each heartbeat.

A consumer is starved while it has room for another message (a free pool slot), its line's
queue has messages, and it takes none of them. A worker whose slots are all held by long
tasks is busy, not starved; an empty queue starves nobody; a worker that is stopping takes
nothing on purpose. Starved for `stall_after_s` it is stalled: whatever the cause (a
cancelled consumer, a fetch that never returns), the heartbeat alone cannot tell it from a
working one."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, kw_only=True)
class ConsumerSample:
    """What a worker's main process sees of its consumer of one line, at one check."""

    # Messages the consumer took from the line's queue since the worker started.
    taken: int
    # Whether the consumer is subscribed to the line's queue at all.
    consuming: bool
    # Messages taken and not finished (running, or waiting for a pool slot).
    held: int
    # How many it may hold at once (its prefetch limit, the pool's size with ours).
    slots: int
    # Messages waiting on the line's queue; None when Redis did not say.
    queue_depth: int | None
    # Whether the worker is shutting down (asked to stop, or its consumer no longer runs).
    stopping: bool = False


@dataclass(frozen=True, kw_only=True)
class StallWatch:
    """What the last check left for the next one."""

    # `ConsumerSample.taken` at the last check.
    taken: int
    # Monotonic time since which the consumer has had room and waiting work and taken
    # nothing; None when it was not starved at the last check.
    starved_since_s: float | None
    # When its consumer was last restarted in this starved spell, and how many times.
    restarted_at_s: float | None = None
    restarts: int = 0

    def starved_s(self, *, now_s: float) -> float:
        """How long it has been starved (0 when it is not)."""
        return 0.0 if self.starved_since_s is None else max(0.0, now_s - self.starved_since_s)

    def is_stalled(self, *, now_s: float, stall_after_s: float) -> bool:
        """Starved for `stall_after_s` or longer. It stays stalled until it takes something
        or has nothing to take: a restart alone does not make it live again."""
        return self.starved_since_s is not None and self.starved_s(now_s=now_s) >= stall_after_s

    def restart_due(self, *, now_s: float, stall_after_s: float) -> bool:
        """Stalled, and its consumer was not restarted within the last `stall_after_s`
        (a restart is given that long to take something)."""
        return self.is_stalled(now_s=now_s, stall_after_s=stall_after_s) and (
            self.restarted_at_s is None or now_s - self.restarted_at_s >= stall_after_s
        )

    def exit_due(
        self, *, now_s: float, stall_after_s: float, restart_waiting_since_s: float | None
    ) -> bool:
        """Stalled still, and the oldest restart its event loop has not run was handed to
        it at `restart_waiting_since_s` (None: none waits), `stall_after_s` ago or more.
        A consumer that took something since is not stalled, so a loop that was only busy
        for a while (a task in the solo pool, which holds the one slot) never makes it due."""
        return (
            restart_waiting_since_s is not None
            and self.is_stalled(now_s=now_s, stall_after_s=stall_after_s)
            and now_s - restart_waiting_since_s >= stall_after_s
        )

    def restarted(self, *, now_s: float) -> StallWatch:
        """The watch after its consumer was restarted at `now_s`."""
        return replace(self, restarted_at_s=now_s, restarts=self.restarts + 1)


def watch(previous: StallWatch | None, sample: ConsumerSample, *, now_s: float) -> StallWatch:
    """Fold `sample`, taken at monotonic `now_s`, into the watch of the previous check
    (None at the first one)."""
    took = previous is not None and sample.taken > previous.taken
    if sample.stopping or not sample.queue_depth or sample.held >= sample.slots:
        # Stopping (its shutdown cancels the consumer and may hold the event loop while
        # tasks finish), nothing to take (or Redis did not say), or no room: not starved.
        return StallWatch(taken=sample.taken, starved_since_s=None)
    if took or previous is None or previous.starved_since_s is None:
        # It took something, or has just become able to: its clock starts now.
        return StallWatch(taken=sample.taken, starved_since_s=now_s)
    return replace(previous, taken=sample.taken)
