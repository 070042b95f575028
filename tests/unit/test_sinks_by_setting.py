"""A line says which sink it uses (`SINK=http|table:<name>|handler`); the defaults are the
three lines' own tables, and a downstream or a handler given alone still chooses its sink."""

from __future__ import annotations

import pytest

from app.config.settings import load_settings
from app.config.sink_settings import Sink, SinkKind
from app.errors import ConfigError
from app.lines import LineRegistry


def sinks(settings) -> dict[str, str]:
    return {line.name: str(line.sink) for line in LineRegistry.from_settings(settings)}


def test_the_default_lines_write_their_own_tables():
    assert sinks(load_settings()) == {
        "order": "table:orders",
        "refund": "table:refunds",
        "status": "table:order_status",
    }


def test_a_downstream_or_a_handler_alone_chooses_the_sink_of_a_default_line(monkeypatch):
    monkeypatch.setenv("PIPELINE_LINES__ORDER__DOWNSTREAM_URL", "http://127.0.0.1:9/in")
    monkeypatch.setenv("PIPELINE_LINES__REFUND__HANDLER", "tests.support.handlers:fail_twice")
    found = sinks(load_settings())
    assert (found["order"], found["refund"], found["status"]) == (
        "http",
        "handler",
        "table:order_status",
    )


def test_a_new_line_without_a_sink_writes_the_shared_table(monkeypatch):
    monkeypatch.setenv("PIPELINE_LINES__SHIPMENT__MAX_QUEUE_LENGTH", "5")
    assert sinks(load_settings())["shipment"] == "table:sink_rows"


def test_a_line_may_name_another_table(monkeypatch):
    monkeypatch.setenv("PIPELINE_LINES__SHIPMENT__SINK", "table:orders")
    line = LineRegistry.from_settings(load_settings()).get("shipment")
    assert (line.sink.kind, line.sink_table, line.table_sink) == (SinkKind.TABLE, "orders", True)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SINK", "table:nowhere"),
        ("SINK", "kafka"),
        ("SINK", "http"),  # no downstream_url
        ("SINK", "handler"),  # no handler
    ],
)
def test_a_sink_that_cannot_work_stops_the_process_naming_the_line(monkeypatch, name, value):
    monkeypatch.setenv(f"PIPELINE_LINES__ORDER__{name}", value)
    with pytest.raises(ConfigError, match="PIPELINE_LINES"):
        load_settings()


def test_a_handler_beside_another_sink_is_refused(monkeypatch):
    monkeypatch.setenv("PIPELINE_LINES__ORDER__SINK", "table:orders")
    monkeypatch.setenv("PIPELINE_LINES__ORDER__HANDLER", "tests.support.handlers:fail_twice")
    with pytest.raises(ConfigError, match="handler"):
        load_settings()


def test_a_sink_reads_back_as_it_is_written():
    for value in ("http", "handler", "table:orders", "table:sink_rows"):
        assert str(Sink.parse(value)) == value


def test_every_table_a_setting_may_name_is_a_table_the_sink_writes():
    from app.config.sink_settings import SINK_TABLES  # noqa: PLC0415
    from app.delivery.sinks import TABLES  # noqa: PLC0415 - beside the settings' list

    assert sorted(TABLES) == sorted(SINK_TABLES)
