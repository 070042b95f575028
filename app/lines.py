"""The line registry: each configured line with its handler and payload schema resolved."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from app.errors import ConfigError, UnknownLine
from app.settings import ENV_PREFIX, LineSettings, Settings

Handler = Callable[[Any], None]


@dataclass(frozen=True, kw_only=True)
class Line:
    """A business line, ready to use. Its Redis queue is named after it (DESIGN §8)."""

    name: str
    settings: LineSettings
    schema: type[BaseModel]
    handler: Handler | None

    @property
    def queue(self) -> str:
        return self.name


def import_object(path: str) -> Any:
    """Import `package.module:attribute` (or `package.module.attribute`)."""
    module_name, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attribute:
        raise ImportError(f"{path!r} is not a dotted path")
    module = importlib.import_module(module_name)
    return getattr(module, attribute)


def _setting(line: str, name: str) -> str:
    return f"{ENV_PREFIX}LINES__{line.upper()}__{name.upper()}"


def _resolve(name: str, settings: LineSettings) -> Line:
    try:
        schema = import_object(settings.payload_schema)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{_setting(name, 'payload_schema')}: cannot import ({exc})") from None
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise ConfigError(f"{_setting(name, 'payload_schema')}: not a pydantic model")
    handler = None
    if settings.handler:
        try:
            handler = import_object(settings.handler)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{_setting(name, 'handler')}: cannot import ({exc})") from None
        if not callable(handler):
            raise ConfigError(f"{_setting(name, 'handler')}: not callable")
    return Line(name=name, settings=settings, schema=schema, handler=handler)


class LineRegistry:
    """The configured lines, by name."""

    def __init__(self, lines: Mapping[str, Line]) -> None:
        self._lines = dict(lines)

    @classmethod
    def from_settings(cls, settings: Settings) -> LineRegistry:
        """Resolve every line. Raises `ConfigError` naming the bad setting."""
        return cls({name: _resolve(name, spec) for name, spec in settings.lines.items()})

    def get(self, name: str) -> Line:
        try:
            return self._lines[name]
        except KeyError:
            raise UnknownLine(f"unknown line {name!r}") from None

    def names(self) -> list[str]:
        return list(self._lines)

    def __iter__(self) -> Any:
        return iter(self._lines.values())
