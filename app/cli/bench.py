"""`pipeline bench`: the benchmark, printed as one run's table."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from app.bench.report import print_table
from app.telemetry.logs import configure_logging


def bench(
    quick: Annotated[bool, typer.Option("--quick", help="A smoke run, a few minutes.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
    redis_url: Annotated[
        str | None,
        typer.Option(help="Use this Redis (its database is flushed); default: start one."),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(help="Use this journal (its tables are emptied); default: a new SQLite."),
    ] = None,
    save: Annotated[
        Path | None, typer.Option(help="Also write the figures to this file, as JSON.")
    ] = None,
    no_wrk: Annotated[
        bool, typer.Option("--no-wrk", help="The built-in load generator even if wrk is here.")
    ] = False,
    scenario: Annotated[
        list[str] | None,
        typer.Option(help="Run only this scenario (repeat for several); default: all."),
    ] = None,
) -> None:
    """Measure the pipeline beside its references, in one run."""
    from app.bench.run import SCENARIOS, run_bench  # noqa: PLC0415 - 0.5 s more for `pipeline --help`

    unknown = sorted(set(scenario or ()) - set(SCENARIOS))
    if unknown:
        raise typer.BadParameter(
            f"no such scenario: {', '.join(unknown)} (scenarios: {', '.join(SCENARIOS)})",
            param_hint="--scenario",
        )

    configure_logging(json=False, level="ERROR")  # the figures own stdout
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as workdir:
        figures = run_bench(
            quick=quick,
            redis_url=redis_url,
            database_url=database_url,
            workdir=Path(workdir),
            progress=lambda message: console.print(f"[dim]bench[/dim] {message}"),
            plain_load=no_wrk,
            scenarios=tuple(scenario) if scenario else SCENARIOS,
        )
    if save is not None:
        save.write_text(json.dumps(figures, indent=2) + "\n")
    if as_json:
        print(json.dumps(figures, indent=2))
    else:
        print_table(figures, Console())
