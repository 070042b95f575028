"""`pipeline records …`: find journal records by filter, show one with its attempts, retry
them, cancel them."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from app.cli.output import (
    JsonOpt,
    check_journal_exists,
    column,
    journal_engine,
    print_json,
    settings_for_command,
    show,
    table,
)
from app.clock import as_utc, utcnow
from app.config.redis import make_redis
from app.config.settings import redis_options
from app.delivery.circuit import CircuitReader
from app.delivery.outcomes import waiting_for
from app.errors import RecordNotFound
from app.journal import attempt_log, audit, store
from app.journal.attempt_log import Attempt
from app.journal.audit import MAX_REASON_LENGTH, cli_actor
from app.journal.journal import Journal
from app.journal.models import Record, RecordStatus, Source
from app.journal.store import RecordFilter
from app.lines import LineRegistry
from app.telemetry.tracing import trace_id_of

if TYPE_CHECKING:
    from app.recovery.record_actions import BulkCounts

# Built on its own when invoked (`app.cli.main.LazyCommands`): no completion options of its own.
records_cli = typer.Typer(
    help="Journal records: find them, retry them, cancel them.",
    no_args_is_help=True,
    add_completion=False,
)

# A record's id, and how wide a terminal shows it whole in a table of records.
ID_LENGTH = 26
WHOLE_ID_WIDTH = 100
_STYLE = {
    RecordStatus.DEAD: "bold red",
    RecordStatus.FAILED: "yellow",
    RecordStatus.DONE: "green",
    RecordStatus.CANCELLED: "dim",
}

LineOpt = Annotated[str | None, typer.Option(help="Only this line.")]
StatusOpt = Annotated[list[RecordStatus] | None, typer.Option(help="Repeat for several.")]
SourceOpt = Annotated[Source | None, typer.Option(help="Only records from this source.")]
BusinessNoOpt = Annotated[
    list[str] | None, typer.Option("--business-no", help="Repeat for several.")
]
SinceOpt = Annotated[str | None, typer.Option(help="Created at or after (ISO 8601).")]
UntilOpt = Annotated[str | None, typer.Option(help="Created before (ISO 8601).")]
ErrorOpt = Annotated[
    str | None,
    typer.Option(
        "--error", help="Last error holds these words anywhere, in any case (no wildcards)."
    ),
]
MinAttemptsOpt = Annotated[int | None, typer.Option(min=0, help="At least this many attempts.")]
MaxAttemptsOpt = Annotated[int | None, typer.Option(min=0, help="At most this many attempts.")]
DeadOpt = Annotated[bool, typer.Option("--dead", help="Shorthand for --status dead.")]
FailedOpt = Annotated[bool, typer.Option("--failed", help="Shorthand for --status failed.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Count, change nothing.")]


def _time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        return as_utc(datetime.fromisoformat(value))
    except (ValueError, OverflowError):
        raise typer.BadParameter(f"{value!r} is not an ISO 8601 time", param_hint=name) from None


def _filter(options: Mapping[str, Any]) -> RecordFilter:
    """The filter a command's filter options name (`locals()` of the command); raises
    `InvalidFilter` for a contradictory one."""
    from app.recovery.record_actions import check_filter  # noqa: PLC0415 - 20 ms more for `pipeline --help`

    statuses = list(options["status"] or [])
    shorthands = ((RecordStatus.DEAD, options["dead"]), (RecordStatus.FAILED, options["failed"]))
    statuses += [status for status, on in shorthands if on]
    where = RecordFilter(
        line=options["line"],
        statuses=list(dict.fromkeys(statuses)),
        source=options["source"],
        business_nos=options["business_no"] or (),
        since=_time(options["since"], "--since"),
        until=_time(options["until"], "--until"),
        error_text=options["error"] or None,
        min_attempts=options["min_attempts"],
        max_attempts=options["max_attempts"],
    )
    check_filter(where)
    return where


def _open_circuits() -> frozenset[str]:
    """The HTTP-sink lines whose circuit is open now (their failed records wait for the
    downstream); none when Redis does not answer."""
    settings = settings_for_command()
    client = make_redis(settings.redis_url, redis_options(settings))
    try:
        names = LineRegistry.from_settings(settings).http_sink_names()
        return CircuitReader(client).open_among(names)
    finally:
        client.close()


def _records_table(items: list[Record], *, open_circuits: frozenset[str] = frozenset()) -> Table:
    """A table of records. Cells are plain `Text`: a business number or an error that looks
    like rich markup (`[red]`) is shown as it is. The error is shown whole, folded onto
    more lines: its end (the status code, the downstream's answer) says the most."""
    shown = table(
        # Whole where the terminal has room for it and the rest: an id is copied into the
        # next command. Narrower, it folds too (a table wider than the terminal is cut).
        column("id", min_width=ID_LENGTH if Console().width >= WHOLE_ID_WIDTH else None),
        "line",
        "business no",
        "status",
        "attempts",
        "last error",
        "created",
    )
    for r in items:
        error = (r.last_error or "-").replace("\n", " ")
        shown.add_row(
            Text(r.id),
            Text(r.line),
            Text(r.business_no),
            _status_text(r, open_circuits=open_circuits),
            Text(str(r.attempts)),
            Text(error),
            Text(r.created_at.strftime("%Y-%m-%dT%H:%M:%SZ")),
        )
    return shown


@records_cli.command("list")
def records_list(  # noqa: PLR0913 - one argument per option
    line: LineOpt = None,
    status: StatusOpt = None,
    source: SourceOpt = None,
    business_no: BusinessNoOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    error: ErrorOpt = None,
    min_attempts: MinAttemptsOpt = None,
    max_attempts: MaxAttemptsOpt = None,
    dead: DeadOpt = False,
    failed: FailedOpt = False,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Records per page.")] = 50,
    after: Annotated[str | None, typer.Option(help="The cursor a previous page printed.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List records by id, a page at a time; prints the cursor of the next page (with
    --json: `GET /v1/records`'s answer, `items` and `next`)."""
    from app.intake.views import record_view  # noqa: PLC0415 - 15 ms more for `pipeline --help`

    where = _filter(locals())
    engine = journal_engine(settings_for_command().database_url)
    try:
        with Journal(engine).reading() as conn:
            page = store.find_records(conn, where, limit=limit, after=after)
            last = attempt_log.last_attempts(conn, [r.id for r in page.items]) if as_json else {}
    finally:
        engine.dispose()
    down = (
        _open_circuits()
        if any(r.status is RecordStatus.FAILED for r in page.items)
        else frozenset()
    )
    if as_json:
        items = [
            record_view(r, open_circuits=down)
            | {"last_attempt": a.summary() if (a := last.get(r.id)) else None}
            for r in page.items
        ]
        print_json({"items": items, "next": page.next})
        return
    show(_records_table(page.items, open_circuits=down))
    print(f"next: {page.next}" if page.next else "next: none (last page)")


def _reason(value: str | None) -> str | None:
    if value is None:
        return None
    reason = value.strip()
    if not reason or len(reason) > MAX_REASON_LENGTH:
        raise typer.BadParameter(f"1 to {MAX_REASON_LENGTH} characters", param_hint="--reason")
    return reason


def _act(
    record_id: str | None,
    where: RecordFilter,
    *,
    cancel: bool,
    dry_run: bool,
    reason: str | None,
    as_json: bool,
) -> None:
    """Retry (or cancel) one record, or those `where` selects, and print what was done
    (`as_json`: as the HTTP API answers the same action)."""
    from app.recovery.record_actions import RecordActions, describe  # noqa: PLC0415 - as above
    from app.wiring.runtime import Runtime  # noqa: PLC0415 - 0.2 s more for `pipeline --help`

    if record_id is not None and (describe(where) or dry_run):
        raise typer.BadParameter("name a record id or filters, not both; --dry-run is for filters")
    verb = "cancel" if cancel else "retry"
    settings = settings_for_command()
    check_journal_exists(settings.database_url)
    rt = Runtime.build(settings)
    try:
        actions = RecordActions(
            journal=rt.journal, pusher=rt.pusher, lines=rt.lines, paused=rt.paused
        )
        if record_id is not None:
            actor, now = cli_actor(), utcnow()
            if cancel:
                record = actions.cancel(record_id, actor=actor, reason=reason or "", now=now)
            else:
                record = actions.retry(record_id, actor=actor, reason=reason, now=now)
            if as_json:
                from app.intake.views import record_view  # noqa: PLC0415 - as above

                print_json(record_view(record))
            else:
                show(_records_table([record]))
            return
        if where.line is not None and not cancel:
            rt.lines.get(where.line)  # a retry pushes: its line must be configured
        columns = (TextColumn(verb), BarColumn(), MofNCompleteColumn())
        with Progress(
            *columns, console=Console(stderr=True), disable=dry_run or as_json
        ) as progress:
            task = progress.add_task(verb, total=actions.selected(where, cancel=cancel))
            counts = actions.bulk(
                where,
                cancel=cancel,
                dry_run=dry_run,
                actor=cli_actor(),
                reason=reason,
                clock=utcnow,
                on_page=lambda n: progress.advance(task, n),
            )
    finally:
        rt.close()
    if as_json:
        print_json(_counts_document(counts, cancel=cancel))
        return
    show(_counts_table(counts, cancel=cancel))
    if dry_run:
        print("dry run: nothing was changed")


def _counts_document(counts: BulkCounts, *, cancel: bool) -> dict[str, Any]:
    """A bulk action's counts as `POST /v1/records/retry` (or `/cancel`) answers them."""
    document: dict[str, Any] = {
        "dry_run": counts.dry_run,
        "matched": counts.matched,
        "cancelled" if cancel else "retried": counts.acted,
        "skipped_status": counts.skipped_status,
        "skipped_in_flight": counts.skipped_in_flight,
    }
    if not cancel:
        document |= {
            "enqueued": None if counts.dry_run else counts.enqueued,
            "deferred": None if counts.dry_run else counts.deferred,
            "skipped_unknown_line": counts.skipped_unknown_line,
        }
    return document


def _counts_table(counts: BulkCounts, *, cancel: bool) -> Table:
    acted = "cancelled" if cancel else "retried"
    if counts.dry_run:
        acted = f"would be {acted}"
    heads = ["matched", acted, "skipped (status)", "skipped (in flight)"]
    cells = [counts.matched, counts.acted, counts.skipped_status, counts.skipped_in_flight]
    if not cancel and not counts.dry_run:
        heads += ["enqueued", "deferred (queue full)", "skipped (unknown line)"]
        cells += [counts.enqueued, counts.deferred, counts.skipped_unknown_line]
    counted = table(*heads)
    counted.add_row(*(str(cell) for cell in cells))
    return counted


@records_cli.command("retry")
def records_retry(  # noqa: PLR0913 - one argument per option
    record_id: Annotated[str | None, typer.Argument(help="One record; or use filters.")] = None,
    line: LineOpt = None,
    status: StatusOpt = None,
    source: SourceOpt = None,
    business_no: BusinessNoOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    error: ErrorOpt = None,
    min_attempts: MinAttemptsOpt = None,
    max_attempts: MaxAttemptsOpt = None,
    dead: DeadOpt = False,
    failed: FailedOpt = False,
    reason: Annotated[str | None, typer.Option(help="Why, for the audit log.")] = None,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Put failed, dead or rejected records back on their queues now (one, or by filter)."""
    where = _filter(locals())
    _act(record_id, where, cancel=False, dry_run=dry_run, reason=_reason(reason), as_json=as_json)


@records_cli.command("cancel")
def records_cancel(  # noqa: PLR0913 - one argument per option
    reason: Annotated[str, typer.Option(help="Why, for the audit log (required).")],
    record_id: Annotated[str | None, typer.Argument(help="One record; or use filters.")] = None,
    line: LineOpt = None,
    status: StatusOpt = None,
    source: SourceOpt = None,
    business_no: BusinessNoOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    error: ErrorOpt = None,
    min_attempts: MinAttemptsOpt = None,
    max_attempts: MaxAttemptsOpt = None,
    dead: DeadOpt = False,
    failed: FailedOpt = False,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Cancel unfinished records: final, never delivered (one by id, or by filter)."""
    where = _filter(locals())
    _act(record_id, where, cancel=True, dry_run=dry_run, reason=_reason(reason), as_json=as_json)


@records_cli.command("show")
def records_show(
    record_id: Annotated[str, typer.Argument(help="The record's id.")],
    as_json: JsonOpt = False,
) -> None:
    """Show a record and its attempts, oldest first (with --json: `GET /v1/records/{id}`'s
    answer). Exits 1 when there is no such record."""
    from app.intake.routes import RECORD_AUDIT_ROWS  # noqa: PLC0415 - FastAPI: 0.3 s more for `pipeline --help`
    from app.intake.views import record_view  # noqa: PLC0415 - 15 ms more for `pipeline --help`

    engine = journal_engine(settings_for_command().database_url)
    try:
        with Journal(engine).reading() as conn:
            record = store.get_record(conn, record_id)
            history = attempt_log.history(conn, record_id) if record is not None else []
            target = f"record:{record_id}"
            rows = audit.newest(conn, limit=RECORD_AUDIT_ROWS, target=target) if record else []
    finally:
        engine.dispose()
    if record is None:
        raise RecordNotFound(f"no record {record_id!r}")
    if as_json:
        print_json(record_view(record, history) | {"audit": [row.public() for row in rows]})
        return
    show(_record_fields(record), _attempts_table(history))


def _status_text(record: Record, *, open_circuits: frozenset[str] = frozenset()) -> Text:
    """A record's status; a `failed` record that spent no attempt, or whose line's circuit
    is open, is shown waiting (for its downstream, or for room), not as a failure."""
    waiting = waiting_for(record, circuit_open=record.line in open_circuits)
    if waiting is not None:
        return Text(f"{record.status.value}, waiting for {waiting.value}", style="cyan")
    return Text(record.status.value, style=_STYLE.get(record.status, ""))


def _iso(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat()


def _record_fields(record: Record) -> Table:
    """The record's fields, one a row (not its payload: `GET /v1/records/{id}` shows it).
    Cells are plain `Text`, as in `_records_table`."""
    fields = table("field", "value", title=f"record {record.id}")
    rows = {
        "line": record.line,
        "business no": record.business_no,
        "source": record.source.value,
        "status": _status_text(record).plain,
        "attempts": str(record.attempts),
        "next attempt at": _iso(record.next_attempt_at),
        "last error": record.last_error or "-",
        "created at": _iso(record.created_at),
        "updated at": _iso(record.updated_at),
        "finished at": _iso(record.finished_at),
        "trace id": trace_id_of(record.traceparent) or "-",
    }
    for name, value in rows.items():
        fields.add_row(name, Text(value))
    return fields


def _attempts_table(history: list[Attempt]) -> Table:
    """One row per attempt, oldest first; plain `Text` cells."""
    attempts = table(
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
        cells = (
            str(attempt.attempt),
            _iso(attempt.started_at),
            _iso(attempt.finished_at),
            f"{attempt.worker_host}:{attempt.worker_pid}",
            attempt.outcome.value,
            "-" if attempt.http_status is None else str(attempt.http_status),
            f"{attempt.duration_ms} ms",
            error,
        )
        attempts.add_row(*(Text(cell) for cell in cells))
    return attempts
