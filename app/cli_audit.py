"""`pipeline audit`: the audit log in the terminal, newest first, a page at a time."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from app.cli_schedules import settings_for_command
from app.ids import is_id

# Rows a page holds unless asked, and at most.
DEFAULT_PAGE = 20
MAX_PAGE = 1000


def _compact(value: dict[str, Any] | None) -> str:
    """`key=value, …`, values as JSON: short enough for a table's cell."""
    if not value:
        return "-"
    return ", ".join(
        f"{key}={json.dumps(item, default=str)}" for key, item in sorted(value.items())
    )


def audit(
    limit: Annotated[
        int, typer.Option(min=1, max=MAX_PAGE, help="Rows on this page.")
    ] = DEFAULT_PAGE,
    after: Annotated[
        str | None, typer.Option(help="The cursor a previous page printed: older rows.")
    ] = None,
) -> None:
    """Show operator actions (replays, retries, cancels, pauses, schedule changes), newest
    first, with who did them; then the cursor of the next page."""
    from app.journal import audit as log  # noqa: PLC0415
    from app.journal.engine import make_engine  # noqa: PLC0415
    from app.journal.journal import Journal  # noqa: PLC0415

    if after is not None and not is_id(after):
        raise typer.BadParameter("not a cursor of the audit log", param_hint="--after")
    engine = make_engine(settings_for_command().database_url)
    try:
        with Journal(engine).reading("audit log read") as conn:
            entries = log.newest(conn, limit=limit + 1, before=after)
    finally:
        engine.dispose()
    page = entries[:limit]
    table = Table(expand=True)
    for header in ("time", "actor", "action"):
        table.add_column(header, no_wrap=True)
    # Folded, never cut: an id or a count cut short would mislead.
    for header, ratio in (("target", 2), ("params", 4), ("result", 3), ("reason", 2)):
        table.add_column(header, overflow="fold", ratio=ratio)
    for entry in page:
        table.add_row(
            entry.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            entry.actor,
            entry.action.value,
            entry.target,
            _compact(entry.params),
            _compact(entry.result),
            entry.reason or "-",
        )
    Console().print(table)
    if len(entries) > limit:
        print(f"next page: pipeline audit --after {page[-1].id}")
    else:
        print("no older entries")
