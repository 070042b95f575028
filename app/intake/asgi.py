"""The intake app built from the environment, for uvicorn's `--factory` (several processes),
and the garbage collector's settings of an intake process."""

from __future__ import annotations

import gc

from fastapi import FastAPI

from app.intake.main import create_app
from app.settings import load_settings

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
    app = create_app(load_settings())
    tune_gc()
    return app
