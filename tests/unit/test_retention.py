"""Retention's settings and statuses: what it may delete, and how short it may be set."""

from __future__ import annotations

import pytest

from app.config.settings import load_settings
from app.errors import ConfigError
from app.journal import expiry
from app.journal.models import RecordStatus as S
from app.journal.transitions import UNFINISHED


def test_retention_takes_every_final_status_and_no_unfinished_one():
    final, undelivered = expiry.FINAL, expiry.UNDELIVERED
    assert final == {S.DONE, S.DEAD, S.REJECTED, S.CANCELLED}
    assert undelivered == {S.DEAD, S.REJECTED, S.CANCELLED}
    assert not final & UNFINISHED
    assert final | UNFINISHED == set(S)


def test_undelivered_records_are_kept_30_days_unless_set():
    settings = load_settings()
    assert (settings.retention_days, settings.retention_undelivered_days) == (30, 30)


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        # 0.005 days is 432 s: below the 600 s a request can be replayed for.
        ({"PIPELINE_RETENTION_DAYS": "0.005"}, "PIPELINE_RETENTION_DAYS"),
        ({"PIPELINE_RETENTION_UNDELIVERED_DAYS": "0.005"}, "PIPELINE_RETENTION_UNDELIVERED_DAYS"),
        # A day is less than twice a window of 12 hours and a second.
        (
            {"PIPELINE_RETENTION_DAYS": "1", "PIPELINE_TIMESTAMP_WINDOW_SECONDS": "43201"},
            "PIPELINE_RETENTION_DAYS",
        ),
        (
            {
                "PIPELINE_RETENTION_UNDELIVERED_DAYS": "1",
                "PIPELINE_TIMESTAMP_WINDOW_SECONDS": "43201",
            },
            "PIPELINE_RETENTION_UNDELIVERED_DAYS",
        ),
    ],
)
def test_a_retention_shorter_than_twice_the_signature_window_is_refused(
    monkeypatch, variables, named
):
    # A record's nonce is forgotten with it: a request signed at the window's edge could be
    # sent again and stored twice.
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith(f"{named}: ")
    assert "PIPELINE_TIMESTAMP_WINDOW_SECONDS" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "variables",
    [
        # 0 keeps the records forever, whatever the window.
        {"PIPELINE_RETENTION_DAYS": "0", "PIPELINE_RETENTION_UNDELIVERED_DAYS": "0"},
        # Exactly twice a window of 12 hours.
        {
            "PIPELINE_RETENTION_DAYS": "1",
            "PIPELINE_RETENTION_UNDELIVERED_DAYS": "1",
            "PIPELINE_TIMESTAMP_WINDOW_SECONDS": "43200",
        },
        # 0.007 days is 604.8 s, above twice the default window.
        {"PIPELINE_RETENTION_DAYS": "0.007", "PIPELINE_RETENTION_UNDELIVERED_DAYS": "0.007"},
    ],
)
def test_a_retention_of_0_or_of_twice_the_signature_window_is_accepted(monkeypatch, variables):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.retention_days == float(variables["PIPELINE_RETENTION_DAYS"])
    assert settings.retention_undelivered_days == float(
        variables["PIPELINE_RETENTION_UNDELIVERED_DAYS"]
    )
