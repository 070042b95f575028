"""Guards of `app.intake.protocol`: the parts of uvicorn's httptools protocol that
`GuardedHttpToolsProtocol` overrides or reads still have the shape it was written for.

uvicorn is pinned to one minor series in pyproject.toml; these fail first when a new one
moves what the protocol relies on. What the protocol does on a live connection (431, 408,
the linger) is checked against a real intake in the integration tier."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import Server, ServerState

from app.config.settings import load_settings
from app.intake.protocol import GuardedHttpToolsProtocol, protocol_for

OVERRIDDEN = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_headers_complete",
    "on_message_complete",
)


async def _app(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app that is never called: the guards build protocols, not requests."""


def test_the_protocol_takes_the_four_arguments_uvicorns_server_passes():
    parameters = list(inspect.signature(HttpToolsProtocol.__init__).parameters.values())
    assert [(p.name, p.default) for p in parameters] == [
        ("self", inspect.Parameter.empty),
        ("config", inspect.Parameter.empty),
        ("server_state", inspect.Parameter.empty),
        ("app_state", inspect.Parameter.empty),
        ("_loop", None),
    ]
    # The server creates each connection's protocol with exactly these keywords.
    source = inspect.getsource(Server)
    assert "http_protocol_class(" in source
    for keyword in ("config=config", "server_state=", "app_state=", "_loop=_loop"):
        assert keyword in source, keyword


@pytest.mark.parametrize("name", OVERRIDDEN)
def test_each_method_the_guard_overrides_is_uvicorns_own(name):
    """Defined by HttpToolsProtocol itself: the guard's `super()` call reaches its code."""
    assert name in vars(HttpToolsProtocol), name
    assert name in vars(GuardedHttpToolsProtocol), name


def test_data_received_hands_the_bytes_to_httptools_parser():
    """The guard feeds the parser through `super().data_received`, piece by piece."""
    assert "feed_data" in HttpToolsProtocol.data_received.__code__.co_names
    assert "parser" in HttpToolsProtocol.data_received.__code__.co_names


def test_a_request_cycle_says_when_its_response_is_complete():
    """The guard reads `cycle.response_complete` before it answers a refusal itself."""
    init = httptools_impl.RequestResponseCycle.__init__
    assert "response_complete" in init.__code__.co_names


def test_uvicorn_takes_a_protocol_factory_that_is_not_a_string():
    settings = load_settings()
    factory = protocol_for(settings)
    config = Config(app=_app, http=factory)
    config.load()
    assert config.http_protocol_class is factory


def test_a_built_protocol_has_the_state_the_guard_reads():
    loop = asyncio.new_event_loop()
    try:
        config = Config(app=_app, http=protocol_for(load_settings()))
        config.load()
        protocol = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=ServerState(), app_state={}, _loop=loop
        )
    finally:
        loop.close()
    assert isinstance(protocol, GuardedHttpToolsProtocol)
    assert protocol.loop is loop
    assert protocol.cycle is None
    assert len(protocol.pipeline) == 0
    assert protocol.header_bytes == 0
