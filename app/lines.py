"""The line registry: each configured line with its handler and payload schema resolved."""

from __future__ import annotations

import importlib
import math
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from app.config.line_settings import LineSettings
from app.config.settings import ENV_PREFIX, Settings
from app.config.sink_settings import Sink, SinkKind
from app.errors import ConfigError, UnknownLine

Handler = Callable[[Any], None]
# A table-sink line's records per message unless its `batch_size` is set. Only records
# pushed together are packed (one group commit, a sweep, a replay page): a lone request's
# message carries it alone, so packing adds no wait.
TABLE_SINK_BATCH = 16
# An HTTP-sink line's records per message unless its `batch_size` is set: its records are
# delivered concurrently, each with its own attempt, on the worker's delivery loop.
HTTP_SINK_BATCH = 32
# An unknown name is echoed back this far at most (it may come from a URL's path).
MAX_SHOWN_NAME = 64


@dataclass(frozen=True, kw_only=True)
class Line:
    """A business line, ready to use. Its Redis queue is named after it."""

    name: str
    settings: LineSettings
    schema: type[BaseModel]
    handler: Handler | None

    @property
    def queue(self) -> str:
        return self.name

    @property
    def sink(self) -> Sink:
        return self.settings.resolved_sink

    @property
    def table_sink(self) -> bool:
        """Whether its records go to the built-in table sink."""
        return self.sink.kind is SinkKind.TABLE

    @property
    def sink_table(self) -> str:
        """The table its table sink writes. Raises `ConfigError` on a line with another sink."""
        if self.sink.table is None:
            raise ConfigError(f"line {self.name!r} has no table sink (its sink is {self.sink})")
        return self.sink.table

    @property
    def batch_size(self) -> int:
        """Records a queue message may carry: the line's `batch_size`, else
        `TABLE_SINK_BATCH` on the table sink (a batch is claimed, written and marked done
        one statement each), `HTTP_SINK_BATCH` on the HTTP sink (its records are
        delivered concurrently, each with its own attempt), and one where a handler runs
        each record in turn, so that a message's run stays within the visibility timeout."""
        if self.settings.batch_size is not None:
            return self.settings.batch_size
        if self.table_sink:
            return TABLE_SINK_BATCH
        return min(HTTP_SINK_BATCH, self.settings.deliveries_in_flight) if self.http_sink else 1

    @property
    def sender_max(self) -> int:
        """The most records one sender may have on the line's queue: its
        `sender_queue_share` of the bound, one at least."""
        settings = self.settings
        return max(1, math.floor(settings.max_queue_length * settings.sender_queue_share))

    @property
    def http_sink(self) -> bool:
        """Whether its records go to the built-in HTTP sink."""
        return self.sink.kind is SinkKind.HTTP


def _setting(line: str, name: str) -> str:
    return f"{ENV_PREFIX}LINES__{line.upper()}__{name.upper()}"


def _import(variable: str, path: str) -> Any:
    """The object `path` names (`module:attribute` or `module.attribute`), by
    `pkgutil.resolve_name`. Raises `ConfigError` naming `variable` and the cause."""
    try:
        return pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError) as exc:
        cause: BaseException = exc
        if ":" not in path and isinstance(exc, AttributeError):
            # The dotted form reports a module that failed to import as a missing attribute
            # of its package; importing the module itself names the real cause.
            try:
                importlib.import_module(path.rpartition(".")[0])
            except ImportError as import_error:
                cause = import_error
        raise ConfigError(f"{variable}: cannot import ({cause})") from None


def _resolve(name: str, settings: LineSettings) -> Line:
    schema = _import(_setting(name, "payload_schema"), settings.payload_schema)
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise ConfigError(f"{_setting(name, 'payload_schema')}: not a pydantic model")
    handler = None
    if settings.handler:
        handler = _import(_setting(name, "handler"), settings.handler)
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
            shown, known = name[:MAX_SHOWN_NAME], ", ".join(self._lines) or "none"
            raise UnknownLine(f"unknown line {shown!r}; the lines are: {known}") from None

    def names(self) -> list[str]:
        return list(self._lines)

    def http_sink_names(self) -> list[str]:
        """The lines that deliver to an HTTP downstream (those with a circuit)."""
        return [name for name, line in self._lines.items() if line.http_sink]

    def __iter__(self) -> Any:
        return iter(self._lines.values())
