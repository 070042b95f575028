"""Flower, Celery's dashboard, run over the pipeline's broker."""

from __future__ import annotations

import secrets

from app.config.settings import Settings

FLOWER_USER = "admin"


def generated_basic_auth() -> str:
    """Credentials for a Flower whose `PIPELINE_FLOWER_BASIC_AUTH` is not set."""
    return f"{FLOWER_USER}:{secrets.token_urlsafe(18)}"


def flower_argv(
    settings: Settings, *, host: str | None = None, port: int | None = None
) -> list[str]:
    """The `celery flower` arguments; the credentials go in `FLOWER_BASIC_AUTH`."""
    return [
        "flower",
        f"--address={host or settings.flower_host}",
        f"--port={settings.flower_port if port is None else port}",
        # Workers that stopped sending heartbeats leave the dashboard.
        "--purge_offline_workers=60",
    ]
