"""A line handler that hangs for some records: named in the line settings as
`tests.support.hanging_handler:hang_or_pass`.

Every call is logged as it enters (one line: the record's id, its attempt number and
`hang` or `pass`) in the file `ENTRIES_VARIABLE` names, so that a test can tell which
attempts really ran the handler, whichever process and thread ran them. A record whose
business number starts with `HANG_PREFIX` then hangs until the file `RELEASE_VARIABLE`
names exists (at most `MAX_HANG_S`: no thread hangs forever); any other returns at once."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

from app.journal.models import Record

# The file each call is logged in as it enters: set by the test for every process.
ENTRIES_VARIABLE = "PIPELINE_TEST_HANDLER_ENTRIES"
# The file whose existence releases the hung calls: set by the test for every process.
RELEASE_VARIABLE = "PIPELINE_TEST_HANDLER_RELEASE"
# The records whose calls hang: their business numbers start with it.
HANG_PREFIX = "HANG"
# A hung call's bound: it fails after this long unreleased.
MAX_HANG_S = 300.0
# How often a hung call looks for the release file.
POLL_S = 0.1

HANG = "hang"
PASS = "pass"


class NeverReleased(RuntimeError):
    pass


def hang_or_pass(record: Record) -> None:
    """Logs its entry; hangs (bounded) for a `HANG…` record until released, else returns."""
    hangs = record.business_no.startswith(HANG_PREFIX)
    _log_entry(os.environ[ENTRIES_VARIABLE], record, HANG if hangs else PASS)
    if not hangs:
        return
    release = Path(os.environ[RELEASE_VARIABLE])
    deadline = time.monotonic() + MAX_HANG_S
    while not release.exists():
        if time.monotonic() >= deadline:
            raise NeverReleased(f"{record.id} was not released within {MAX_HANG_S:g} s")
        time.sleep(POLL_S)


def entries(path: Path) -> dict[str, set[int]]:
    """The attempts whose handler call entered, by record id, from the log at `path`."""
    found: dict[str, set[int]] = defaultdict(set)
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        record_id, attempt, _kind = line.split()
        found[record_id].add(int(attempt))
    return dict(found)


def entry_count(path: Path, kind: str) -> int:
    """How many calls of `kind` (`HANG` or `PASS`) entered, from the log at `path`."""
    lines = path.read_text().splitlines() if path.exists() else []
    return sum(1 for line in lines if line.split()[2] == kind)


def _log_entry(path: str, record: Record, kind: str) -> None:
    # One write of a line under O_APPEND: lines of several threads never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{record.id} {record.attempts} {kind}\n".encode())
    finally:
        os.close(fd)
