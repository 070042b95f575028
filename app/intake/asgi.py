"""The intake app built from the environment, for uvicorn's `--factory` (several processes)."""

from __future__ import annotations

from fastapi import FastAPI

from app.intake.main import create_app
from app.settings import load_settings


def app_from_env() -> FastAPI:
    return create_app(load_settings())
