"""Every move of a record's status, in one table: which statuses an event may move a
record from, where to, and what it asks of the record's lease.

A record's attempt takes a lease on it: its owner, its attempt number (the fencing
token) and an expiry. While a lease is live no other attempt starts, and nothing pushes
the record again, from any path (a second message, the sweeper, a replay, the intake
under `caller_runs`). Only the attempt that holds the lease records an outcome: an
outcome whose attempt number is no longer the record's (another attempt took over an
expired lease) changes nothing. The journal's SQL guards are built from this table
(`app.journal.store`), and it is tested as a table, status by event."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from app.journal.models import RecordStatus

S = RecordStatus


class Event(StrEnum):
    """What happens to a record."""

    PUSHED = "pushed"  # the intake put it on its queue
    DEFERRED = "deferred"  # its queue was full under `defer` (or a fire found it full)
    REJECTED = "rejected"  # its queue was full under `reject`
    RESENT = "resent"  # a rejected request came again
    SWEPT = "swept"  # the sweeper claims it, to push it
    REPLAYED = "replayed"  # a replay claims it, to push it
    NOT_PUSHED = "not_pushed"  # a claimed push did not fit: it waits in the journal
    SYNCED = "synced"  # a replay found that downstream already has it
    ATTEMPT = "attempt"  # an attempt starts: it takes the lease
    SUCCEEDED = "succeeded"  # the lease holder delivered it
    RETRY = "retry"  # the lease holder's attempt failed; another is due later
    DIED = "died"  # the lease holder's attempt failed and none is left
    GIVEN_BACK = "given_back"  # the lease holder's attempt does not count (circuit open)
    POSTPONED = "postponed"  # no attempt starts (circuit open, or no room under limits)
    RETRIED = "retried"  # an operator puts a failed, dead or rejected record back on its queue
    CANCELLED = "cancelled"  # an operator cancels a record that has not finished


class Lease(StrEnum):
    """What an event asks of the record's lease."""

    ANY = "any"  # bookkeeping of a record not yet run: any lease may stand
    FREE = "free"  # no live lease: nobody is running the record
    HELD = "held"  # the caller holds it: same owner, same attempt number


@dataclass(frozen=True, kw_only=True)
class Transition:
    """An event's rule. `to` None: the status stays what it was."""

    sources: frozenset[RecordStatus]
    to: RecordStatus | None
    lease: Lease


UNFINISHED = frozenset({S.RECEIVED, S.ENQUEUED, S.DEFERRED, S.FAILED})
# What a worker runs: a record on a queue or on its way there. A `failed` one waits for
# its retry, which the sweeper pushes when it is due.
RUNNABLE = frozenset({S.RECEIVED, S.ENQUEUED, S.DEFERRED})
# What a replay takes: anything unfinished, and the dead. A rejected or a cancelled record
# is taken only when its status is named (a rejected one's caller was told 429 and may have
# sent it again; a cancelled one was meant never to be delivered).
REPLAYABLE = UNFINISHED | {S.DEAD, S.REJECTED, S.CANCELLED}
# What an operator's retry takes: a record that waits for its retry, or that no attempt
# will run again.
RETRYABLE = frozenset({S.FAILED, S.DEAD, S.REJECTED})

TRANSITIONS: dict[Event, Transition] = {
    Event.PUSHED: Transition(sources=frozenset({S.RECEIVED}), to=S.ENQUEUED, lease=Lease.ANY),
    Event.DEFERRED: Transition(sources=frozenset({S.RECEIVED}), to=S.DEFERRED, lease=Lease.FREE),
    Event.REJECTED: Transition(sources=frozenset({S.RECEIVED}), to=S.REJECTED, lease=Lease.FREE),
    Event.RESENT: Transition(sources=frozenset({S.REJECTED}), to=S.RECEIVED, lease=Lease.FREE),
    Event.SWEPT: Transition(sources=UNFINISHED, to=S.ENQUEUED, lease=Lease.FREE),
    Event.REPLAYED: Transition(sources=REPLAYABLE, to=S.ENQUEUED, lease=Lease.FREE),
    Event.NOT_PUSHED: Transition(sources=frozenset({S.ENQUEUED}), to=S.DEFERRED, lease=Lease.FREE),
    Event.SYNCED: Transition(sources=REPLAYABLE, to=S.DONE, lease=Lease.FREE),
    Event.ATTEMPT: Transition(sources=RUNNABLE, to=None, lease=Lease.FREE),
    Event.SUCCEEDED: Transition(sources=RUNNABLE, to=S.DONE, lease=Lease.HELD),
    Event.RETRY: Transition(sources=RUNNABLE, to=S.FAILED, lease=Lease.HELD),
    Event.DIED: Transition(sources=RUNNABLE, to=S.DEAD, lease=Lease.HELD),
    Event.GIVEN_BACK: Transition(sources=RUNNABLE, to=S.FAILED, lease=Lease.HELD),
    Event.POSTPONED: Transition(sources=RUNNABLE, to=S.FAILED, lease=Lease.FREE),
    Event.RETRIED: Transition(sources=RETRYABLE, to=S.ENQUEUED, lease=Lease.FREE),
    # Anything but delivered: a dead or rejected record too (the operator gives up on it).
    Event.CANCELLED: Transition(
        sources=UNFINISHED | {S.DEAD, S.REJECTED}, to=S.CANCELLED, lease=Lease.FREE
    ),
}


def next_status(status: RecordStatus, event: Event) -> RecordStatus | None:
    """Where `event` moves a record in `status`; None when it may not move it."""
    rule = TRANSITIONS[event]
    if status not in rule.sources:
        return None
    return rule.to or status


def sources(event: Event, *, among: frozenset[RecordStatus] | None = None) -> list[str]:
    """The statuses `event` may move a record from (narrowed to `among`), as stored."""
    allowed = TRANSITIONS[event].sources
    if among is not None:
        unknown = among - allowed
        if unknown:
            raise ValueError(f"{event.value} never moves a record from {sorted(unknown)}")
        allowed = among
    return sorted(status.value for status in allowed)
