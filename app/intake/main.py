"""`create_app(settings)`: the intake's ASGI app. Builds its clients, connects to nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.clock import utcnow
from app.group_accept import GroupAccept
from app.intake import errors, routes
from app.intake.limits import ConcurrencyLimit
from app.runtime import Runtime
from app.settings import Settings

# Threads answering requests at once share this many journal connections.
DB_POOL_SIZE = 10


def create_app(settings: Settings) -> FastAPI:
    """The intake app for `settings`. Raises `ConfigError` for a bad line setting."""
    rt = Runtime.build(settings, db_pool_size=DB_POOL_SIZE)
    group = GroupAccept(rt, clock=utcnow)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        group.close()
        rt.close()

    app = FastAPI(
        title="Durable pipeline intake",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.runtime = rt
    app.state.group_accept = group
    app.state.caller_run_limiters = {}
    errors.install(app)
    app.add_middleware(ConcurrencyLimit, limit=settings.intake_max_concurrent_requests)
    app.include_router(routes.router)
    return app
