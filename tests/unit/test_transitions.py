"""The table of a record's moves, status by event: every pair is stated here, so a change
to the table is a change to this test."""

from __future__ import annotations

import itertools

import pytest

from app.journal.models import RecordStatus as S
from app.journal.transitions import TRANSITIONS, Event, Lease, next_status, sources

# Every status an event moves a record from, and where to; a pair not listed is refused.
EXPECTED: dict[Event, dict[S, S]] = {
    Event.PUSHED: {S.RECEIVED: S.ENQUEUED},
    Event.DEFERRED: {S.RECEIVED: S.DEFERRED},
    Event.REJECTED: {S.RECEIVED: S.REJECTED},
    Event.RESENT: {S.REJECTED: S.RECEIVED},
    Event.SWEPT: dict.fromkeys((S.RECEIVED, S.ENQUEUED, S.DEFERRED, S.FAILED), S.ENQUEUED),
    Event.REPLAYED: dict.fromkeys(
        (S.RECEIVED, S.ENQUEUED, S.DEFERRED, S.FAILED, S.DEAD, S.REJECTED, S.CANCELLED),
        S.ENQUEUED,
    ),
    Event.NOT_PUSHED: {S.ENQUEUED: S.DEFERRED},
    Event.SYNCED: dict.fromkeys(
        (S.RECEIVED, S.ENQUEUED, S.DEFERRED, S.FAILED, S.DEAD, S.REJECTED, S.CANCELLED), S.DONE
    ),
    # An attempt keeps the status it found; its lease says it runs.
    Event.ATTEMPT: {S.RECEIVED: S.RECEIVED, S.ENQUEUED: S.ENQUEUED, S.DEFERRED: S.DEFERRED},
    Event.SUCCEEDED: dict.fromkeys((S.RECEIVED, S.ENQUEUED, S.DEFERRED), S.DONE),
    Event.RETRY: dict.fromkeys((S.RECEIVED, S.ENQUEUED, S.DEFERRED), S.FAILED),
    Event.GIVEN_BACK: dict.fromkeys((S.RECEIVED, S.ENQUEUED, S.DEFERRED), S.FAILED),
    Event.POSTPONED: dict.fromkeys((S.RECEIVED, S.ENQUEUED, S.DEFERRED), S.FAILED),
    Event.DIED: dict.fromkeys((S.RECEIVED, S.ENQUEUED, S.DEFERRED), S.DEAD),
    # An operator's actions: a retry takes what no attempt will run again (or not yet), a
    # cancel anything not delivered.
    Event.RETRIED: dict.fromkeys((S.FAILED, S.DEAD, S.REJECTED), S.ENQUEUED),
    Event.CANCELLED: dict.fromkeys(
        (S.RECEIVED, S.ENQUEUED, S.DEFERRED, S.FAILED, S.DEAD, S.REJECTED), S.CANCELLED
    ),
}

LEASES = {
    Event.PUSHED: Lease.ANY,
    Event.DEFERRED: Lease.FREE,
    Event.REJECTED: Lease.FREE,
    Event.RESENT: Lease.FREE,
    Event.SWEPT: Lease.FREE,
    Event.REPLAYED: Lease.FREE,
    Event.NOT_PUSHED: Lease.FREE,
    Event.SYNCED: Lease.FREE,
    Event.ATTEMPT: Lease.FREE,
    Event.SUCCEEDED: Lease.HELD,
    Event.RETRY: Lease.HELD,
    Event.GIVEN_BACK: Lease.HELD,
    Event.POSTPONED: Lease.FREE,
    Event.DIED: Lease.HELD,
    Event.RETRIED: Lease.FREE,
    Event.CANCELLED: Lease.FREE,
}


@pytest.mark.parametrize(("status", "event"), list(itertools.product(S, Event)))
def test_every_status_and_event_moves_as_the_table_says(status: S, event: Event) -> None:
    assert next_status(status, event) == EXPECTED[event].get(status)


def test_every_event_is_in_the_table_with_its_lease_rule() -> None:
    assert set(TRANSITIONS) == set(Event) == set(EXPECTED)
    assert {event: rule.lease for event, rule in TRANSITIONS.items()} == LEASES


def test_nothing_moves_a_final_record_but_a_replay_a_resend_a_retry_or_a_cancel() -> None:
    for event in Event:
        for final in (S.DONE, S.DEAD, S.REJECTED, S.CANCELLED):
            moved = next_status(final, event)
            allowed = (
                (event is Event.REPLAYED and final is not S.DONE)
                or (event is Event.SYNCED and final is not S.DONE)
                or (event is Event.RESENT and final is S.REJECTED)
                or (event is Event.RETRIED and final in (S.DEAD, S.REJECTED))
                or (event is Event.CANCELLED and final in (S.DEAD, S.REJECTED))
            )
            assert (moved is not None) == allowed, (final, event)


def test_a_cancelled_record_is_never_run_swept_retried_or_cancelled_again() -> None:
    for event in (Event.ATTEMPT, Event.SWEPT, Event.RETRIED, Event.CANCELLED, Event.PUSHED):
        assert next_status(S.CANCELLED, event) is None, event


def test_only_the_lease_holder_records_an_outcome() -> None:
    outcomes = {Event.SUCCEEDED, Event.RETRY, Event.DIED, Event.GIVEN_BACK}
    assert {e for e, rule in TRANSITIONS.items() if rule.lease is Lease.HELD} == outcomes


def test_sources_can_be_narrowed_but_not_widened() -> None:
    assert sources(Event.SWEPT, among=frozenset({S.FAILED})) == ["failed"]
    with pytest.raises(ValueError, match="never moves"):
        sources(Event.PUSHED, among=frozenset({S.DONE}))
