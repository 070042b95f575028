"""The `pipeline` command."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator, MutableMapping
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.main
from rich.console import Console
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from typer.core import TyperGroup

from app.cli.output import (
    JsonOpt,
    check_journal_exists,
    is_missing_tables,
    no_journal_message,
    print_json,
    settings_for_command,
    show,
    table,
)
from app.clock import as_utc, utcnow
from app.config.names import CHECKED_VARIABLE, unknown_variables
from app.config.settings import Settings, load_settings
from app.errors import AdminNotConfigured, ConfigError, JournalUnavailable, PipelineError
from app.journal import audit
from app.journal.engine import journal_failure_message, make_engine, refuse_unsafe_journal
from app.journal.models import RecordStatus
from app.lines import LineRegistry
from app.local.flower import flower_argv, generated_basic_auth
from app.telemetry.logs import get_logger
from app.wiring.priority import lower_priority

log = get_logger(__name__)

# Every command imports this module, `pipeline --help` and the light ones (`send`) too: a
# command of the stack imports its component (the intake, Celery, the runtime) when it
# runs, each such import marked with what it would cost the others.


# The commands declared in their own modules, as `module:attribute` (a typer app, or a
# command's function), in the order help lists them around the ones declared below.
LAZY_FIRST = {
    "audit": "app.cli.audit:audit",
    "bench": "app.cli.bench:bench",
    "send": "app.cli.send:send",
    "pause": "app.cli.lines:pause",
    "resume": "app.cli.lines:resume",
}
LAZY_LAST = {
    "schedules": "app.cli.schedules:schedules_cli",
    "records": "app.cli.records:records_cli",
}


class LazyCommands(MutableMapping[str, Any]):
    """A group's commands, by name: those of `LAZY_FIRST` and `LAZY_LAST` imported only
    when one is looked up (invoked, or listed by help), so a command loads only its own
    module. Every name is here from the start: typer's "did you mean" finds them all."""

    def __init__(self, declared: MutableMapping[str, Any]) -> None:
        self._lazy = {**LAZY_FIRST, **LAZY_LAST}
        self._loaded: dict[str, Any] = dict(declared)

    def __getitem__(self, name: str) -> Any:
        if name not in self._loaded and name in self._lazy:
            module_name, _, attribute = self._lazy[name].partition(":")
            target = getattr(importlib.import_module(module_name), attribute)
            if not isinstance(target, typer.Typer):
                target, function = typer.Typer(add_completion=False), target
                target.command(name)(function)
            command = typer.main.get_command(target)
            command.name = name  # a typer app is named where it is added: here
            self._loaded[name] = command
        return self._loaded[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        self._lazy.pop(name, None)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        first = [name for name in self._lazy if name in LAZY_FIRST]
        declared = [name for name in self._loaded if name not in self._lazy]
        last = [name for name in self._lazy if name in LAZY_LAST]
        return iter([*first, *declared, *last])

    def __len__(self) -> int:
        return len(set(self._loaded) | set(self._lazy))


class LazyGroup(TyperGroup):
    """The `pipeline` command, its commands a `LazyCommands`."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.commands = LazyCommands(self.commands)


cli = typer.Typer(
    cls=LazyGroup,
    help="A durable task pipeline: journaled intake, bounded per-line queues, Celery workers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
db_cli = typer.Typer(help="The journal's schema.", no_args_is_help=True)
cli.add_typer(db_cli, name="db")


def _settings() -> Settings:
    return settings_for_command()


def admin_closed_notice(settings: Settings) -> str | None:
    """What the intake says at start when its admin endpoints are closed (no admin token,
    and not dev mode, which opens them): how to open them. None when they are open."""
    if settings.admin_actors or settings.in_dev_mode:
        return None
    return AdminNotConfigured().message


def say_if_journal_unreachable(url: str) -> None:
    """At a component's start, one warning when its (server) journal does not answer: the
    component runs through the outage (the intake answers 503, a worker's messages are
    requeued), and the warning names PIPELINE_DATABASE_URL and what was tried."""
    if make_url(url).get_backend_name() == "sqlite":
        return  # opened by `refuse_unsafe_journal`
    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as exc:
        message = f"{journal_failure_message(url, exc)}; running on, waiting for it"
        log.warning("journal_unreachable", message=message)
    finally:
        engine.dispose()


@cli.command()
def up(
    workdir: Annotated[
        Path, typer.Option(help="Where the log file (up.log) and the embedded Redis's files go.")
    ] = Path(".pipeline"),
    share_redis: Annotated[
        bool,
        typer.Option(
            "--share-redis",
            help="Use a Redis database that holds another application's keys (refused "
            "otherwise); as PIPELINE_REDIS_SHARED=true.",
        ),
    ] = False,
) -> None:
    """Run the whole stack in the foreground; Ctrl-C stops it all."""
    from app.intake.exposure import check_bind_host  # noqa: PLC0415 - Starlette: 0.4 s
    from app.local.supervisor import run_stack  # noqa: PLC0415 - 0.1 s

    settings = _settings()
    notices: list[str] = []
    if not settings.intake_keys and not settings.dev_mode:
        # A fresh checkout runs as it is: dev mode, asked for here, for every child.
        os.environ["PIPELINE_DEV_MODE"] = "true"
        settings = _settings()
        notices.append(
            "dev mode on: no PIPELINE_INTAKE_KEYS, so the intake takes unsigned requests, from "
            "this machine only (set PIPELINE_INTAKE_KEYS to leave dev mode)"
        )
    LineRegistry.from_settings(settings)  # a bad line setting stops us before any child starts
    check_bind_host(settings, settings.intake_host)
    notice = admin_closed_notice(settings)
    if notice is not None:
        notices.append(f"admin: {notice}")
    code = run_stack(settings, workdir=workdir.resolve(), notices=notices, share_redis=share_redis)
    raise typer.Exit(code)


@cli.command()
def intake(
    host: Annotated[str | None, typer.Option(help="Overrides PIPELINE_INTAKE_HOST.")] = None,
    port: Annotated[int | None, typer.Option(help="Overrides PIPELINE_INTAKE_PORT.")] = None,
) -> None:
    """Serve the HTTP intake."""
    import uvicorn  # noqa: PLC0415 - with the intake's: 0.5 s

    from app.intake.asgi import tune_gc  # noqa: PLC0415 - FastAPI: 0.5 s
    from app.intake.exposure import check_bind_host  # noqa: PLC0415 - as above
    from app.intake.main import create_app  # noqa: PLC0415 - as above
    from app.intake.protocol import server_options  # noqa: PLC0415 - as above

    settings = _settings()
    bind = host or settings.intake_host
    check_bind_host(settings, bind)
    refuse_unsafe_journal(settings.database_url)
    say_if_journal_unreachable(settings.database_url)
    app = create_app(settings)  # refuses no keys without dev mode; says so in dev mode
    notice = admin_closed_notice(settings)
    if notice is not None:
        log.warning("admin_endpoints_closed", message=notice)
    tune_gc()
    bind_port = port if port is not None else settings.intake_port
    # The same server options for one process and for several: the header limits are in
    # the HTTP protocol they name (app.intake.protocol).
    options = server_options(settings)
    if settings.intake_workers > 1:
        # Each process builds its app from the environment: give it the host we bind.
        os.environ["PIPELINE_INTAKE_HOST"] = bind
        uvicorn.run(
            "app.intake.asgi:app_from_env",
            factory=True,
            host=bind,
            port=bind_port,
            workers=settings.intake_workers,
            **options,
        )
        return
    uvicorn.run(app, host=bind, port=bind_port, **options)


@cli.command()
def worker(
    line: Annotated[str, typer.Argument(help="The business line whose queue to consume.")],
    concurrency: Annotated[
        int | None,
        typer.Option(
            help="Overrides the line's setting (`concurrency`; on an HTTP-sink line, the "
            "messages its thread pool runs at once, each handing its records to the "
            "process's delivery loop)."
        ),
    ] = None,
    pool: Annotated[
        str | None,
        typer.Option(
            help="Celery pool: prefork, solo or threads. Default: threads on an HTTP-sink "
            "line (its deliveries wait on the downstream), else prefork."
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="Without Celery's start-up banner.")] = False,
) -> None:
    """Run the Celery worker of one line; exits with the worker's exit code."""
    from celery.signals import worker_init  # noqa: PLC0415 - Celery: 70 ms

    from app.celery_app import create_celery  # noqa: PLC0415 - as above

    settings = _settings()
    spec = LineRegistry.from_settings(settings).get(line)
    refuse_unsafe_journal(settings.database_url)
    say_if_journal_unreachable(settings.database_url)
    lower_priority(settings.nice, component=f"worker {line}")
    celery = create_celery(settings)
    pool = pool or ("threads" if spec.http_sink else "prefork")
    if concurrency is None:
        concurrency = spec.settings.concurrency
        if pool == "threads" and spec.http_sink:
            # A message may carry one record (under light load each does): as many
            # messages at once as the line keeps deliveries in flight. A thread only waits
            # for its message's outcomes, on the process's delivery loop.
            concurrency = spec.settings.deliveries_in_flight
    # Read by the worker's runtime (its journal pool's size), not by Celery.
    celery.conf.update(worker_pool=pool, worker_concurrency=concurrency)
    # Celery's `worker_main` returns nothing: its exit code is the worker's to read, and a
    # supervisor reads ours.
    workers: list[Any] = []
    worker_init.connect(lambda sender, **_kwargs: workers.append(sender), weak=False)
    celery.worker_main(
        [
            *(["--quiet"] if quiet else []),
            "worker",
            "--queues",
            spec.queue,
            "--concurrency",
            str(concurrency),
            "--pool",
            pool,
            "--hostname",
            f"{line}@%h",
            "--loglevel",
            settings.log_level,
            "--without-mingle",
            "--without-gossip",
        ]
    )
    raise typer.Exit(next((w.exitcode for w in workers if w.exitcode), 0))


@cli.command()
def beat(
    scheduler: Annotated[
        str | None,
        typer.Option(
            help="The scheduler class, as module:Class: a subclass of the pipeline's "
            "(beat.scheduler:PipelineScheduler) that adds or wraps maintenance jobs."
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="Without Celery's start-up banner.")] = False,
) -> None:
    """Run Celery beat with the pipeline's scheduler: the cron schedules, and the sweeper, the
    lost-message check, the queue monitor and retention while it holds the beat lock."""
    from app.celery_app import BEAT_SCHEDULER, create_celery  # noqa: PLC0415 - Celery: 70 ms

    settings = _settings()
    LineRegistry.from_settings(settings)
    refuse_unsafe_journal(settings.database_url)
    say_if_journal_unreachable(settings.database_url)
    lower_priority(settings.nice, component="beat")
    create_celery(settings).start(
        [
            *(["--quiet"] if quiet else []),
            "beat",
            "--scheduler",
            scheduler or BEAT_SCHEDULER,
            "--loglevel",
            settings.log_level,
        ]
    )


@cli.command()
def flower(
    port: Annotated[int | None, typer.Option(help="Overrides PIPELINE_FLOWER_PORT.")] = None,
    host: Annotated[str | None, typer.Option(help="Overrides PIPELINE_FLOWER_HOST.")] = None,
) -> None:
    """Run Flower, Celery's dashboard, over the pipeline's broker, behind basic auth."""
    from app.celery_app import create_celery  # noqa: PLC0415 - Celery: 70 ms

    settings = _settings()
    if settings.flower_basic_auth is None:
        credentials = generated_basic_auth()
        print(f"flower: basic auth {credentials} (set PIPELINE_FLOWER_BASIC_AUTH to choose)")
    else:
        credentials = settings.flower_basic_auth.get_secret_value()
    # Through the environment, not argv: `ps` shows a command line to every user.
    os.environ["FLOWER_BASIC_AUTH"] = credentials
    create_celery(settings).start(flower_argv(settings, host=host, port=port))


@cli.command()
def status(as_json: JsonOpt = False) -> None:
    """Show each line: queue depth / bound, policy, journal counts, oldest unfinished age
    (with --json: `GET /v1/lines`'s answer)."""
    from app.intake.views import line_status_view  # noqa: PLC0415 - 90 ms
    from app.wiring.runtime import Runtime  # noqa: PLC0415 - 0.3 s

    settings = _settings()
    check_journal_exists(settings.database_url)
    rt = Runtime.build(settings)
    try:
        rows = rt.view.line_statuses(now=utcnow())
    finally:
        rt.close()
    if as_json:
        print_json({"lines": [line_status_view(row) for row in rows]})
        return
    lines = table(
        "line",
        "records / bound (messages)",
        "policy",
        "live workers",
        "counts",
        "oldest unfinished",
        "paused",
        "senders (past fair share)",
    )
    for row in rows:
        depth = "redis down" if row.queue_depth is None else str(row.queue_depth)
        if row.queue_messages is not None:
            depth_text = f"{depth} / {row.max_queue_length} ({row.queue_messages})"
        else:
            depth_text = f"{depth} / {row.max_queue_length}"
        counts = ", ".join(f"{k}={v}" for k, v in sorted(row.counts.items())) or "-"
        age = "-" if row.oldest_unfinished_age_s is None else f"{row.oldest_unfinished_age_s:.0f}s"
        live = "?" if row.live_workers is None else str(row.live_workers)
        paused = "-" if row.pause is None else f"paused by {row.pause.actor}"
        senders = ", ".join(
            f"{s.sender}={s.records}" + (f" ({s.past_share})" if s.past_share else "")
            for s in row.senders or []
        )
        lines.add_row(row.line, depth_text, row.overflow, live, counts, age, paused, senders or "-")
    show(lines)


def _time_option(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not an ISO 8601 time", param_hint=name) from None
    return as_utc(parsed)


@cli.command()
def replay(
    line: Annotated[str | None, typer.Option(help="Only this line.")] = None,
    since: Annotated[str | None, typer.Option(help="Created at or after (ISO 8601).")] = None,
    until: Annotated[str | None, typer.Option(help="Created before (ISO 8601).")] = None,
    business_no: Annotated[
        list[str] | None, typer.Option("--business-no", help="Repeat for several.")
    ] = None,
    status: Annotated[
        list[RecordStatus] | None,
        typer.Option(
            help="Repeat for several; default: every status but done and rejected "
            "(name rejected to replay those)."
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count, change nothing.")] = False,
    reason: Annotated[str | None, typer.Option(help="Why, for the audit log.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Put records that did not finish back on their queues, skipping what downstream has
    (with --json: the counts as `POST /v1/replay` answers them)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn  # noqa: PLC0415 - 6 ms

    from app.recovery.replay import DEFAULT_STATUSES, ReplayFilter  # noqa: PLC0415 - 0.25 s
    from app.wiring.runtime import Runtime  # noqa: PLC0415 - 0.3 s

    where = ReplayFilter(
        line=line,
        since=_time_option(since, "--since"),
        until=_time_option(until, "--until"),
        business_nos=business_no or (),
        statuses=status or DEFAULT_STATUSES,
    )
    settings = _settings()
    check_journal_exists(settings.database_url)
    rt = Runtime.build(settings)
    try:
        if line is not None:
            rt.lines.get(line)
        total = rt.replayer.count_matching(where)
        columns = (TextColumn("replay"), BarColumn(), MofNCompleteColumn())
        with Progress(*columns, console=Console(stderr=True), disable=as_json) as progress:
            task = progress.add_task("replay", total=total)
            counts = rt.replayer.replay(
                where,
                dry_run=dry_run,
                actor=audit.cli_actor(),
                reason=reason,
                clock=utcnow,
                on_page=lambda n: progress.advance(task, n),
            )
        rt.alerts.flush(timeout_s=5)
    finally:
        rt.close()
    if as_json:
        print_json(
            {
                "matched": counts.matched,
                "enqueued": counts.enqueued,
                "deferred": counts.deferred,
                "skipped_already_done": counts.skipped_done,
                "skipped_already_synced": counts.skipped_synced,
                "skipped_in_flight": counts.skipped_in_flight,
                "dry_run": dry_run,
            }
        )
        return
    counted = table(
        "matched",
        "enqueued",
        "deferred",
        "skipped (done)",
        "skipped (downstream has)",
        "skipped (in flight)",
    )
    counted.add_row(
        str(counts.matched),
        str(counts.enqueued),
        str(counts.deferred),
        str(counts.skipped_done),
        str(counts.skipped_synced),
        str(counts.skipped_in_flight),
    )
    show(counted)
    if dry_run:
        print("dry run: nothing was changed")


@db_cli.command("upgrade")
def db_upgrade() -> None:
    """Apply the journal's migrations."""
    from app.journal.schema import upgrade  # noqa: PLC0415 - Alembic: 70 ms

    settings = _settings()
    engine = make_engine(settings.database_url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    print(f"journal at head: {engine.url.render_as_string(hide_password=True)}")


def warn_unknown_variables() -> None:
    """One warning on stderr for each `PIPELINE_` variable no setting reads, naming the
    closest one; once for a command and the processes it starts."""
    if os.environ.get(CHECKED_VARIABLE):
        return
    for unknown in unknown_variables(os.environ):
        print(f"pipeline: warning: {unknown.warning()}", file=sys.stderr)
    os.environ[CHECKED_VARIABLE] = "1"


def main() -> None:
    """Entry point: one clear line, never a traceback, for a bad setting or a failure we know."""
    # Handlers are named by dotted path from the directory we run in, as with `celery -A`.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    warn_unknown_variables()
    try:
        cli()
    except ConfigError as exc:
        print(f"pipeline: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    except PipelineError as exc:
        cause = exc.__cause__
        if isinstance(exc, JournalUnavailable) and isinstance(cause, SQLAlchemyError):
            # The journal's own words, with its URL (password hidden) and what was tried.
            print(f"pipeline: {_journal_failure(cause)}", file=sys.stderr)
        else:
            print(f"pipeline: {exc}", file=sys.stderr)
        sys.exit(1)
    except SQLAlchemyError as exc:
        print(f"pipeline: {_journal_failure(exc)}", file=sys.stderr)
        sys.exit(1)


def _journal_failure(exc: SQLAlchemyError) -> str:
    """What a command says of a journal error: no journal yet (a database without its
    tables), or the journal's URL, what was tried and what the database said."""
    try:
        url = load_settings().database_url
    except ConfigError:
        return f"the journal database failed: {type(exc).__name__}"
    if is_missing_tables(exc):
        return no_journal_message(make_url(url).render_as_string(hide_password=True))
    return journal_failure_message(url, exc)
