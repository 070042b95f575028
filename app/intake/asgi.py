"""The intake app built from the environment, for uvicorn's `--factory` (several processes),
and the garbage collector's settings of an intake process.

`pipeline intake` (and `pipeline up`) start uvicorn with the intake's own HTTP protocol,
which limits headers while they are read (`app.intake.protocol`); plain
`uvicorn --factory app.intake.asgi:app_from_env` does not: pass it
`--http app.intake.protocol:GuardedHttpToolsProtocol` (defaults for the limits) or use
`pipeline intake`."""

from __future__ import annotations

import gc
import sys

from fastapi import FastAPI

from app.config.settings import load_settings
from app.errors import ConfigError
from app.intake.exposure import check_bind_host
from app.intake.main import create_app

# A full collection walks every object the process holds (FastAPI's, SQLAlchemy's): under
# load it pauses the intake for tens of milliseconds. What exists at start is frozen out of
# collections, and the youngest generation is collected less often; cycles are still
# collected.
GC_THRESHOLDS = (50_000, 50, 100)


def tune_gc() -> None:
    """Call once the app is built, before serving."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def app_from_env() -> FastAPI:
    """The intake app of the environment's settings. A bad setting (dev mode with a
    `PIPELINE_INTAKE_HOST` that is not loopback included) ends the process with one line
    and exit code 2, as `pipeline` does. In dev mode the app answers loopback clients only,
    whatever uvicorn was told to bind (`app.intake.exposure`)."""
    try:
        settings = load_settings()
        check_bind_host(settings, settings.intake_host)
        app = create_app(settings)
    except ConfigError as exc:
        print(f"pipeline: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    tune_gc()
    return app
