"""The commit queue's promise to a caller that stops waiting: its group is rolled back when
it has not begun to commit (so "nothing was kept" is true), and a commit that gives no
outcome is answered "in doubt", never "nothing was kept". The writes here are plain
functions on the queue's own thread: what a transaction does is the journal's to test."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

import pytest

from app.errors import JournalInDoubt, JournalUnavailable
from app.journal.commits import CommitGate, CommitQueue, GroupGivenUp

TIMEOUT_S = 0.2


def test_a_group_given_up_before_its_commit_is_rolled_back_and_answered_unavailable() -> None:
    release = threading.Event()
    kept: list[str] = []
    rolled_back: list[str] = []

    def write(items: list[str], answer: Callable[[Sequence[str]], None], gate: CommitGate) -> None:
        release.wait(timeout=10)  # a statement waiting on the journal's lock
        try:
            gate()
        except GroupGivenUp:
            rolled_back.extend(items)
            raise
        kept.extend(items)
        answer(items)

    queue: CommitQueue[str, str] = CommitQueue(write, name="test", timeout_s=TIMEOUT_S)
    try:
        with pytest.raises(JournalUnavailable) as refused:
            asyncio.run(queue.put("a"))
        assert not isinstance(refused.value, JournalInDoubt)
        release.set()
    finally:
        queue.close(timeout_s=10)
    assert (kept, rolled_back) == ([], ["a"])


def test_a_commit_that_gives_no_outcome_is_answered_in_doubt_not_unavailable() -> None:
    release = threading.Event()

    def write(items: list[str], answer: Callable[[Sequence[str]], None], gate: CommitGate) -> None:
        gate()  # committing: past this point the caller cannot give the group up
        release.wait(timeout=10)  # a COMMIT the network holds
        answer(items)

    queue: CommitQueue[str, str] = CommitQueue(write, name="test", timeout_s=TIMEOUT_S)
    try:
        with pytest.raises(JournalInDoubt):
            asyncio.run(queue.put("a"))
        release.set()
    finally:
        queue.close(timeout_s=10)


def test_a_commit_that_ends_within_the_second_wait_is_the_answer() -> None:
    def write(items: list[str], answer: Callable[[Sequence[str]], None], gate: CommitGate) -> None:
        gate()
        threading.Event().wait(TIMEOUT_S * 1.5)  # a slow fsync: past the first wait only
        answer([f"{item} kept" for item in items])

    queue: CommitQueue[str, str] = CommitQueue(write, name="test", timeout_s=TIMEOUT_S)
    try:
        assert asyncio.run(queue.put("a")) == "a kept"
    finally:
        queue.close(timeout_s=10)
