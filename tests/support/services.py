"""Optional services some tests need from the machine (a browser, a redis-server built with
TLS, root and pg_ctlcluster to restart PostgreSQL). Where one is missing the test is
skipped, with the reason, on a developer's machine; in CI (the variable `CI` set to anything
but the empty string) it fails with the same reason instead, so that a CI machine that lost
a service cannot pass by skipping what needs it."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

# Set by CI, e.g. CI=true: there every optional service must be present.
CI_VARIABLE = "CI"


def required_here(also_when: str | None = None) -> bool:
    """Whether a missing service fails the test here: in CI, or when the variable
    `also_when` (a narrower switch, for one service) is set."""
    names = [CI_VARIABLE] if also_when is None else [CI_VARIABLE, also_when]
    return any(os.environ.get(name) for name in names)


def skip_or_fail(reason: str, *, also_when: str | None = None) -> NoReturn:
    """Skip the test with `reason`; fail it with the same reason in CI."""
    if required_here(also_when):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def require(available: object, reason: str, *, also_when: str | None = None) -> None:
    """Go on when `available` is true; otherwise `skip_or_fail(reason)`."""
    if not available:
        skip_or_fail(reason, also_when=also_when)
