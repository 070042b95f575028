"""Line handlers used by the tests, named by dotted path in the line settings."""

from __future__ import annotations

import time

from app.journal.models import Record


class Boom(RuntimeError):
    pass


def fail_twice(record: Record) -> None:
    """Fails on the first two attempts, succeeds on the third."""
    if record.attempts < 3:
        raise Boom(f"attempt {record.attempts} fails on purpose")


def always_fail(record: Record) -> None:
    raise Boom(f"attempt {record.attempts} always fails")


NOT_CALLABLE = 42


def slow(record: Record) -> None:
    """A deliberately slow downstream."""
    time.sleep(0.05)
