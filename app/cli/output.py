"""What the `pipeline` commands share: the settings a command runs with, what they print
(tables that wrap rather than cut, the `--json` document a script reads instead), and the
journal a read command opens only when it is there."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Column, Table
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from app.config.settings import Settings, load_settings
from app.errors import PipelineError
from app.journal.engine import make_engine
from app.telemetry.logs import configure_logging

JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json", help="Print one JSON document, shaped as the HTTP API's answer, and nothing else."
    ),
]


def settings_for_command() -> Settings:
    """The settings of a command, with its logging configured. Raises `ConfigError`."""
    settings = load_settings()
    configure_logging(json=settings.log_json, level=settings.log_level)
    return settings


def column(header: str, **options: Any) -> Column:
    """A table column whose cells wrap, and fold a word longer than the column, onto more
    lines when the terminal is narrow: never cut, never an ellipsis (rich cuts a `no_wrap`
    cell, whatever its overflow). A `min_width` keeps a value copied into the next command
    (an id) on one line as long as the terminal allows."""
    return Column(header, overflow="fold", no_wrap=False, **options)


def table(*headers: str | Column, **options: Any) -> Table:
    """A table whose columns (given by header, or as `column`s) fold rather than cut."""
    columns = [h if isinstance(h, Column) else column(h) for h in headers]
    return Table(*columns, **options)


def show(*renderables: Any) -> None:
    """Print tables (or text) to stdout, as wide as the terminal (`COLUMNS`)."""
    console = Console()
    for renderable in renderables:
        console.print(renderable)


def print_json(document: Any) -> None:
    """One JSON document on stdout, and a newline."""
    sys.stdout.write(json.dumps(document, indent=2, default=str, ensure_ascii=False) + "\n")
    sys.stdout.flush()


class NoJournal(PipelineError):
    """There is no journal yet."""

    code = "no_journal"


def no_journal_message(where: str) -> str:
    return (
        f"there is no journal yet at {where}: run `pipeline up` (or `pipeline db upgrade`) "
        "first, or set PIPELINE_DATABASE_URL to the journal to read"
    )


def check_journal_exists(url: str) -> None:
    """Raise `NoJournal` for a SQLite journal whose file is not there: opening it would
    create an empty one. A server's journal (PostgreSQL) is checked when read: a database
    without the journal's tables is named the same way (`is_missing_tables`)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return
    if parsed.database.startswith("file:"):
        return  # a SQLite URI: its own options say whether it may be created
    path = Path(parsed.database).resolve()
    if not path.is_file():
        raise NoJournal(no_journal_message(str(path)))


def journal_engine(url: str) -> Engine:
    """The engine of a command that reads or changes the journal (not one that creates
    it): raises `NoJournal`, creating nothing, when there is none yet."""
    check_journal_exists(url)
    return make_engine(url)


def is_missing_tables(exc: BaseException) -> bool:
    """Whether a database error says the journal's tables are not there (a database
    `pipeline db upgrade` never ran on)."""
    text = str(getattr(exc, "orig", exc)).lower()
    return "no such table" in text or ("relation" in text and "does not exist" in text)
