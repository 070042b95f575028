"""What a line's delivery settings mean: which HTTP answers count as delivered, and which
sink the line uses. Pure values, parsed from the settings' strings."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

# A delivered status: the class `2xx`, or one exact code of 200-499 (a 1xx is never the
# final answer; a 5xx is the downstream failing, never its acceptance).
_DELIVERED_CODE = re.compile(r"^[2-4][0-9][0-9]$")
SUCCESS_CLASS = "2xx"
# The placeholder a line's `check_url` must hold: replay asks downstream per record id.
CHECK_URL_ID = "{id}"


@dataclass(frozen=True, kw_only=True)
class DeliveredStatuses:
    """Which HTTP answers of a downstream mean it has the record: `status_code in it`."""

    success: bool
    codes: frozenset[int]

    @classmethod
    def parse(cls, value: str) -> DeliveredStatuses:
        """`2xx` and/or exact codes, comma-separated. Raises `ValueError`."""
        parts = [part.strip().lower() for part in value.split(",")]
        for part in parts:
            if part != SUCCESS_CLASS and not _DELIVERED_CODE.match(part):
                raise ValueError(
                    f"{part!r} is not 2xx or a status code of 200-499 "
                    "(a comma-separated list such as 2xx,409)"
                )
        return cls(
            success=SUCCESS_CLASS in parts,
            codes=frozenset(int(part) for part in parts if part != SUCCESS_CLASS),
        )

    def __contains__(self, status_code: object) -> bool:
        if not isinstance(status_code, int):
            return False
        return (self.success and 200 <= status_code < 300) or status_code in self.codes

    def __str__(self) -> str:
        return ",".join([SUCCESS_CLASS] * self.success + [str(c) for c in sorted(self.codes)])


class SinkKind(StrEnum):
    """Where a line's records go."""

    HTTP = "http"  # POSTed to the line's `downstream_url`
    TABLE = "table"  # upserted into a table of the journal's database
    HANDLER = "handler"  # handed to the line's `handler`


# The tables the built-in table sink writes: keyed by business number (`orders`, `refunds`),
# the newest status per order (`order_status`), or by (line, business number).
SINK_TABLES = ("orders", "refunds", "order_status", "sink_rows")
# The table of a line that names none, has no handler and no downstream.
DEFAULT_SINK_TABLE = "sink_rows"


@dataclass(frozen=True, kw_only=True)
class Sink:
    """A line's sink: its kind and, for the table sink, the table."""

    kind: SinkKind
    table: str | None = None

    @classmethod
    def parse(cls, value: str) -> Sink:
        """`http`, `handler` or `table:<name>`. Raises `ValueError`."""
        kind, _, table = value.partition(":")
        if kind == SinkKind.TABLE and table in SINK_TABLES:
            return cls(kind=SinkKind.TABLE, table=table)
        if kind in (SinkKind.HTTP, SinkKind.HANDLER) and not table:
            return cls(kind=SinkKind(kind))
        raise ValueError(
            f"{value!r} is not http, handler or table:<name> with a name among "
            f"{', '.join(SINK_TABLES)}"
        )

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.table}" if self.table else self.kind.value
