"""`pipeline audit`: the audit log in the terminal, newest first, a page at a time."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from app.cli.output import (
    JsonOpt,
    column,
    journal_engine,
    print_json,
    settings_for_command,
    show,
    table,
)
from app.ids import is_id
from app.journal import audit as log
from app.journal.journal import Journal

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
    as_json: JsonOpt = False,
) -> None:
    """Show operator actions (replays, retries, cancels, pauses, schedule changes), newest
    first, with who did them; then the cursor of the next page (with --json:
    `GET /v1/audit`'s answer, `items` and `next`)."""
    if after is not None and not is_id(after):
        raise typer.BadParameter("not a cursor of the audit log", param_hint="--after")
    engine = journal_engine(settings_for_command().database_url)
    try:
        with Journal(engine).reading("audit log read") as conn:
            entries = log.newest(conn, limit=limit + 1, before=after)
    finally:
        engine.dispose()
    page = entries[:limit]
    cursor = page[-1].id if len(entries) > limit else None
    if as_json:
        print_json({"items": [entry.public() for entry in page], "next": cursor})
        return
    # Folded, never cut: an id or a count cut short would mislead.
    rows = table(
        *(column(header) for header in ("time", "actor", "action")),
        *(
            column(header, ratio=ratio)
            for header, ratio in (("target", 2), ("params", 4), ("result", 3), ("reason", 2))
        ),
        expand=True,
    )
    for entry in page:
        rows.add_row(
            entry.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            entry.actor,
            entry.action.value,
            entry.target,
            _compact(entry.params),
            _compact(entry.result),
            entry.reason or "-",
        )
    show(rows)
    if cursor:
        print(f"next page: pipeline audit --after {cursor}")
    else:
        print("no older entries")
