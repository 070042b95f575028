"""`create_app(settings)`: the intake's ASGI app. Builds its clients, connects to nothing."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from app.admission.intake_path import intake_pipeline
from app.clock import utcnow
from app.config.settings import Settings
from app.errors import ConfigError
from app.intake import (
    docs,
    errors,
    routes,
    routes_audit,
    routes_console,
    routes_lines,
    routes_records,
    routes_schedules,
)
from app.intake.admin import AdminRoutes, require_admin
from app.intake.exposure import LoopbackOnly, check_keys_or_dev_mode
from app.intake.gate import RequestGate
from app.intake.pacing import pacers_for
from app.lines import LineRegistry
from app.recovery.drain import Drainer
from app.wiring.priority import lower_priority
from app.wiring.runtime import Runtime

# Threads answering requests at once share this many journal connections.
DB_POOL_SIZE = 10


def create_app(settings: Settings) -> FastAPI:
    """The intake app for `settings`. Raises `ConfigError` for a bad line setting, or for
    no intake keys without dev mode (`app.intake.exposure`)."""
    lower_priority(settings.nice, component="intake")
    rt = Runtime.build(settings, db_pool_size=DB_POOL_SIZE, component="intake")
    try:
        check_keys_or_dev_mode(settings)
    except ConfigError:
        rt.close()
        raise
    # New records deferred behind older ones while their queue has room: push the older
    # ones now, rather than at the sweeper's next pass.
    drainer = Drainer(rt.sweeper, clock=utcnow)
    acceptor = dataclasses.replace(rt.acceptor, on_room_behind=drainer.request)
    group, pushes = intake_pipeline(
        acceptor,
        clock=utcnow,
        timeout_s=settings.journal_timeout_seconds,
        # A record still waiting for its push after half the sweeper's grace is left to it.
        stale_after_s=settings.received_grace_seconds / 2,
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        group.close()
        pushes.close()
        drainer.close()
        rt.close()

    app = FastAPI(
        title="Durable pipeline intake",
        version="0.1.0",
        lifespan=lifespan,
        # `docs.install` serves /docs from an installed package, not a CDN; no ReDoc.
        docs_url=None,
        redoc_url=None,
        # A request's span is FastAPI's own, outermost of all (it covers every answer, a
        # refusal's too), from our provider alone (none without the endpoint, not the global
        # one's). No spans of its own inside it: the request's is the push span's parent. Our
        # own counters, not its metrics and logs.
        telemetry={
            "tracing": rt.tracer_provider is not None,
            "tracer_provider": rt.tracer_provider,
            "operation_spans": False,
            "metrics": False,
            "logs": False,
            "auto_configure": False,
        },
    )
    app.state.runtime = rt
    app.state.group_accept = group
    app.state.caller_run_rooms = {}
    app.state.pacers = pacers_for(rt.lines, in_flight_limit=settings.intake_max_concurrent_requests)
    errors.install(app)
    # The records' own router first: `POST /v1/{line}`, the route nearly every request
    # takes, is matched without trying the console's and the operator's routes before it
    # (a full match is taken wherever it is; the order only saves time).
    routers = [
        routes.router,
        routes_console.router,
        routes_schedules.router,
        routes_records.router,
        routes_audit.router,
        routes_lines.router,
    ]
    app.add_middleware(
        RequestGate,
        settings=settings,
        admin_routes=AdminRoutes(
            (r for router in routers for r in router.routes), check=require_admin
        ),
        lines=rt.lines,
        telemetry=rt.telemetry,
    )
    if settings.in_dev_mode:
        app.add_middleware(LoopbackOnly)  # added last: the outermost, before any limit
    for router in routers:
        app.include_router(router)
    app.router.routes.insert(0, routes.record_route(rt.lines.names()))
    _document_lines(app, rt.lines)
    docs.install(app, settings)
    return app


def _document_lines(app: FastAPI, lines: LineRegistry) -> None:
    """The OpenAPI document shows `POST /v1/{line}` as one path per configured line, each
    with its line's payload schema."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            template = document["paths"].pop("/v1/{line}", {}).get("post")
            if template is not None:
                for line in lines:
                    operation = copy.deepcopy(template)
                    operation["operationId"] = f"post_record_{line.name}"
                    operation["summary"] = f"Journal a record for the {line.name} line"
                    operation["parameters"] = [
                        p for p in operation.get("parameters", []) if p["name"] != "line"
                    ]
                    body = operation["requestBody"]["content"]["application/json"]
                    body["schema"] = line.schema.model_json_schema()
                    document["paths"][f"/v1/{line.name}"] = {"post": operation}
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
