"""The line registry's answer for a line it does not have."""

from __future__ import annotations

import pytest

from app.config.settings import load_settings
from app.errors import UnknownLine
from app.lines import LineRegistry


def test_an_unknown_line_is_refused_with_the_known_ones(monkeypatch):
    monkeypatch.setenv("PIPELINE_LINES__SHIPMENT__DOWNSTREAM_URL", "http://127.0.0.1:9/in")
    lines = LineRegistry.from_settings(load_settings())
    with pytest.raises(UnknownLine) as refused:
        lines.get("orders")
    assert refused.value.message == (
        "unknown line 'orders'; the lines are: order, refund, status, shipment"
    )


def test_a_long_unknown_name_is_not_echoed_whole():
    lines = LineRegistry.from_settings(load_settings())
    with pytest.raises(UnknownLine) as refused:
        lines.get("x" * 5000)
    assert len(refused.value.message) < 200
