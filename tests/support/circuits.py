"""The engine's circuits asked from a test's own thread: each ask one round trip, on an
event loop and a client of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from app.config.line_settings import LineSettings
from app.config.redis import make_async_redis, make_redis
from app.delivery.circuit import (
    CircuitReader,
    Circuits,
    CircuitState,
    Counted,
    Health,
    Outcome,
    Verdict,
)

T = TypeVar("T")


class CircuitsNow:
    """`Circuits` and `CircuitReader` of the Redis at `url`, called without a loop."""

    def __init__(self, url: str) -> None:
        self._url = url

    def _ask(self, ask: Callable[[Circuits], Awaitable[T]]) -> T:
        async def asked() -> T:
            client = make_async_redis(self._url)
            try:
                return await ask(Circuits(client))
            finally:
                await client.aclose()

        return asyncio.run(asked())

    def admit(self, line: str, settings: LineSettings, **options: Any) -> Verdict:
        return self._ask(lambda circuits: circuits.admit(line, settings, **options))

    def count_all(self, line: str, settings: LineSettings, outcomes: Sequence[Outcome]) -> Counted:
        return self._ask(lambda circuits: circuits.count_all(line, settings, outcomes))

    def count(
        self, line: str, settings: LineSettings, *, health: Health, owner: str = ""
    ) -> Counted:
        return self.count_all(line, settings, [Outcome(health=health, owner=owner)])

    def drop_probe(self, line: str, owner: str) -> None:
        self._ask(lambda circuits: circuits.drop_probe(line, owner))

    def state(self, line: str) -> CircuitState:
        client = make_redis(self._url)
        try:
            return CircuitReader(client).state(line)
        finally:
            client.close()
