"""Line handlers used by the tests, named by dotted path in the line settings."""

from __future__ import annotations

import os
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


# Where `logged_run` appends one line per run: set by the test for every process it starts.
RUNS_LOG_VARIABLE = "PIPELINE_TEST_RUNS_LOG"


def logged_run(record: Record) -> None:
    """Sleeps `payload["sleep_s"]` (default 1 s) and logs when each run starts and ends, so
    a test can tell whether two runs of one record overlapped, whichever process ran them."""
    path = os.environ[RUNS_LOG_VARIABLE]
    _log_run(path, f"start {record.id} {time.time():.6f} {os.getpid()}")
    try:
        time.sleep(float(record.payload.get("sleep_s", 1)))
    finally:
        _log_run(path, f"end {record.id} {time.time():.6f} {os.getpid()}")


def _log_run(path: str, line: str) -> None:
    # One write of a line under O_APPEND: lines of several processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


# The lease owner `taken_over` writes: another process's attempt.
TAKEOVER_OWNER = "elsewhere:1:takeover"


def taken_over(record: Record) -> None:
    """Runs while another attempt takes the record over, as if this one's lease had expired
    meanwhile: that attempt counts itself and holds the lease when this one reports back."""
    from sqlalchemy import update  # noqa: PLC0415 - only this handler writes the journal

    from app.journal.engine import make_engine  # noqa: PLC0415
    from app.journal.models import records  # noqa: PLC0415

    engine = make_engine(os.environ["PIPELINE_DATABASE_URL"])
    try:
        with engine.begin() as conn:
            conn.execute(
                update(records)
                .where(records.c.id == record.id)
                .values(attempts=records.c.attempts + 1, lease_owner=TAKEOVER_OWNER)
            )
    finally:
        engine.dispose()
