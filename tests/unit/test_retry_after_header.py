"""How much of a wait a downstream's `Retry-After` asks, as the HTTP sink reads it."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from app.delivery.sinks import MAX_RETRY_AFTER_S, retry_after

NOW_S = 1_800_000_000.0


def answer(status: int, value: str | None) -> tuple[int, dict[str, str]]:
    """An answer's status and headers, as the HTTP sink reads them."""
    return status, ({} if value is None else {"Retry-After": value})


@pytest.mark.parametrize("status", [429, 503])
def test_seconds_and_an_http_date_are_read_on_429_and_503(status):
    assert retry_after(*answer(status, "7"), now_s=NOW_S) == 7
    date = format_datetime(datetime.fromtimestamp(NOW_S + 30, tz=UTC), usegmt=True)
    assert retry_after(*answer(status, date), now_s=NOW_S) == pytest.approx(30)


def test_a_date_past_is_no_wait_and_a_wait_too_long_is_cut():
    past = format_datetime(datetime.fromtimestamp(NOW_S - 30, tz=UTC), usegmt=True)
    assert retry_after(*answer(503, past), now_s=NOW_S) == 0
    assert retry_after(*answer(429, "99999999"), now_s=NOW_S) == MAX_RETRY_AFTER_S


@pytest.mark.parametrize(
    ("status", "value"),
    [(500, "7"), (422, "7"), (429, None), (429, "soon"), (503, "-5"), (503, "1.5")],
)
def test_other_answers_and_unreadable_values_ask_nothing(status, value):
    assert retry_after(*answer(status, value), now_s=NOW_S) is None
