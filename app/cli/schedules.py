"""`pipeline schedules …`: cron schedules in the database, fired by beat. Each change is
audited as `cli:<user>`, in the transaction that makes it."""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli.output import JsonOpt, journal_engine, print_json, settings_for_command, show, table
from app.clock import utcnow
from app.journal import audit
from app.journal.audit import Action
from app.lines import LineRegistry

# Built on its own when invoked (`app.cli.main.LazyCommands`): no completion options of its own.
schedules_cli = typer.Typer(
    help="Cron schedules, fired by beat.", no_args_is_help=True, add_completion=False
)


_settings = settings_for_command
# What each change did, as its audit row's result and the line printed.
_DONE = {
    Action.SCHEDULE_REMOVE: "removed",
    Action.SCHEDULE_ENABLE: "enabled",
    Action.SCHEDULE_DISABLE: "disabled",
}


@schedules_cli.command("list")
def schedules_list(as_json: JsonOpt = False) -> None:
    """Show every schedule (with --json: `GET /v1/schedules`'s answer)."""
    from app.schedules import store as schedules  # noqa: PLC0415 - croniter: 10 ms more for `pipeline --help`

    engine = journal_engine(_settings().database_url)
    try:
        with engine.connect() as conn:
            rows = schedules.list_all(conn)
    finally:
        engine.dispose()
    if as_json:
        from app.intake.routes_schedules import schedule_view  # noqa: PLC0415 - FastAPI: 0.35 s more for `pipeline --help`

        now = utcnow()
        print_json({"items": [schedule_view(row, now=now) for row in rows]})
        return
    listed = table("name", "cron", "timezone", "line", "enabled", "misfire", "last fire", "next")
    for row in rows:
        listed.add_row(
            row.name,
            row.cron,
            row.timezone,
            row.line,
            "yes" if row.enabled else "no",
            row.misfire.value,
            row.last_fire_at.isoformat() if row.last_fire_at else "-",
            row.next_fire_at.isoformat() if row.next_fire_at else "-",
        )
    show(listed)


@schedules_cli.command("add")
def schedules_add(
    name: Annotated[str, typer.Argument(help="A unique name.")],
    cron: Annotated[str, typer.Option(help="5 fields, or 6 with seconds last.")],
    line: Annotated[str, typer.Option(help="The line each fire goes to.")],
    payload: Annotated[str, typer.Option(help="JSON object sent with each fire.")] = "{}",
    timezone: Annotated[str, typer.Option(help="IANA time zone.")] = "UTC",
    misfire: Annotated[str, typer.Option(help="fire_once, skip or fire_all.")] = "fire_once",
    catchup_window: Annotated[
        int, typer.Option(help="Seconds of missed fires to catch up.")
    ] = 3600,
    replace: Annotated[bool, typer.Option("--replace", help="Change an existing one.")] = False,
) -> None:
    """Add (or, with --replace, change) a schedule. Beat picks it up within seconds."""
    from app.schedules import store as schedules  # noqa: PLC0415 - as in `schedules_list`

    settings = _settings()
    cron_expr, body, policy = schedules.validate(
        LineRegistry.from_settings(settings),
        name=name,
        cron=cron,
        timezone=timezone,
        line=line,
        payload=payload,
        misfire=misfire,
    )
    if catchup_window < 0:
        raise typer.BadParameter("must be 0 or more", param_hint="--catchup-window")
    engine = journal_engine(settings.database_url)
    try:
        with engine.begin() as conn:
            now = utcnow()
            changed = schedules.add(
                conn,
                name=name,
                cron=cron_expr,
                timezone=timezone,
                line=line,
                payload=body,
                misfire=policy,
                catchup_window_s=catchup_window,
                now=now,
                replace=replace,
            )
            audit.write(
                conn,
                actor=audit.cli_actor(),
                action=Action.SCHEDULE_ADD,
                target=f"schedule:{name}",
                params={
                    "cron": cron_expr,
                    "timezone": timezone,
                    "line": line,
                    "payload": body,
                    "misfire": policy.value,
                    "catchup_window_s": catchup_window,
                    "replace": replace,
                },
                result={"changed" if changed else "added": 1},
                reason=None,
                now=now,
            )
    finally:
        engine.dispose()
    print(f"schedule {name!r} {'changed' if changed else 'added'}: {cron_expr} ({timezone})")


def _schedule_change(name: str, action: Action) -> None:
    from app.schedules import store as schedules  # noqa: PLC0415 - as in `schedules_list`

    engine = journal_engine(_settings().database_url)
    try:
        with engine.begin() as conn:
            now = utcnow()
            if action is Action.SCHEDULE_REMOVE:
                schedules.remove(conn, name)
            else:
                enabled = action is Action.SCHEDULE_ENABLE
                schedules.set_enabled(conn, name, enabled=enabled, now=now)
            audit.write(
                conn,
                actor=audit.cli_actor(),
                action=action,
                target=f"schedule:{name}",
                params={},
                result={_DONE[action]: 1},
                reason=None,
                now=now,
            )
    finally:
        engine.dispose()
    print(f"schedule {name!r}: {_DONE[action]}")


@schedules_cli.command("remove")
def schedules_remove(name: str) -> None:
    """Delete a schedule."""
    _schedule_change(name, Action.SCHEDULE_REMOVE)


@schedules_cli.command("enable")
def schedules_enable(name: str) -> None:
    """Enable a schedule (it fires from now on; no catch-up of the disabled time)."""
    _schedule_change(name, Action.SCHEDULE_ENABLE)


@schedules_cli.command("disable")
def schedules_disable(name: str) -> None:
    """Disable a schedule."""
    _schedule_change(name, Action.SCHEDULE_DISABLE)
