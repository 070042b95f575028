"""`pipeline pause LINE` / `pipeline resume LINE`: an operator stops a line's attempts and
pushes, and lets them go on again (audited as `cli:<user>`)."""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli.output import check_journal_exists, settings_for_command
from app.clock import utcnow
from app.journal.audit import cli_actor

LineArgument = Annotated[str, typer.Argument(help="The business line.")]
ReasonOption = Annotated[str | None, typer.Option(help="Why, for the audit log.")]


def pause(line: LineArgument, reason: ReasonOption = None) -> None:
    """Pause a line: its new records are journaled (deferred), no worker starts an attempt
    of them and the sweeper pushes nothing of it, within 2 s, until it is resumed."""
    _act("pause", line, reason)


def resume(line: LineArgument, reason: ReasonOption = None) -> None:
    """Resume a paused line: what waited is pushed first, oldest first."""
    _act("resume", line, reason)


def _act(action: str, line: str, reason: str | None) -> None:
    from app.wiring.runtime import Runtime  # noqa: PLC0415 - 0.2 s more for `pipeline --help`

    settings = settings_for_command()
    check_journal_exists(settings.database_url)
    rt = Runtime.build(settings)
    try:
        act = rt.pauser.pause if action == "pause" else rt.pauser.resume
        state = act(line, actor=cli_actor(), reason=reason, now=utcnow())
    finally:
        rt.close()
    if state.pause is None:
        print(f"{state.line}: running" + ("" if state.changed else " (it was not paused)"))
        return
    since = state.pause.paused_at.isoformat()
    again = "" if state.changed else " (already)"
    print(f"{state.line}: paused{again} since {since} by {state.pause.actor}")
