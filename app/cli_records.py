"""`pipeline records …`: the journal's records, read from the journal directly."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from app.cli_schedules import settings_for_command
from app.errors import RecordNotFound
from app.journal.attempt_log import Attempt
from app.journal.models import Record

records_cli = typer.Typer(help="The journal's records.", no_args_is_help=True)


@records_cli.command("show")
def records_show(
    record_id: Annotated[str, typer.Argument(help="The record's id.")],
) -> None:
    """Show a record and its attempts, oldest first. Exits 1 when there is no such record."""
    from app.journal import attempt_log, store  # noqa: PLC0415
    from app.journal.engine import make_engine  # noqa: PLC0415
    from app.journal.journal import Journal  # noqa: PLC0415

    engine = make_engine(settings_for_command().database_url)
    try:
        with Journal(engine).reading() as conn:
            record = store.get_record(conn, record_id)
            history = attempt_log.history(conn, record_id) if record is not None else []
    finally:
        engine.dispose()
    if record is None:
        raise RecordNotFound(f"no record {record_id!r}")
    console = Console()
    console.print(record_table(record))
    console.print(attempts_table(history))


def _time(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat()


def record_table(record: Record) -> Table:
    """The record's fields, one a row (no payload: it may be large, and `GET
    /v1/records/{id}` shows it)."""
    table = Table("field", "value", title=f"record {record.id}")
    rows = {
        "line": record.line,
        "business no": record.business_no,
        "source": record.source.value,
        "status": record.status.value,
        "attempts": str(record.attempts),
        "next attempt at": _time(record.next_attempt_at),
        "last error": record.last_error or "-",
        "created at": _time(record.created_at),
        "updated at": _time(record.updated_at),
        "finished at": _time(record.finished_at),
    }
    for name, value in rows.items():
        table.add_row(name, value)
    return table


def attempts_table(history: list[Attempt]) -> Table:
    """One row per attempt, oldest first."""
    table = Table(
        "#",
        "started",
        "finished",
        "worker",
        "outcome",
        "http",
        "duration",
        "error",
        title="attempts" if history else "attempts: none yet",
    )
    for attempt in history:
        error = f"{attempt.error_class}: {attempt.error_message}" if attempt.error_class else "-"
        table.add_row(
            str(attempt.attempt),
            _time(attempt.started_at),
            _time(attempt.finished_at),
            f"{attempt.worker_host}:{attempt.worker_pid}",
            attempt.outcome.value,
            "-" if attempt.http_status is None else str(attempt.http_status),
            f"{attempt.duration_ms} ms",
            error,
        )
    return table
