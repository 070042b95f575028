"""What every request passes before a route sees it, in this order, each refusal the usual
JSON error:

1. headers of at most a size and a count (431; the size is also bounded while headers are
   read, by the HTTP protocol `pipeline intake` runs: `app.intake.protocol`);
2. health checks go straight on, so an overloaded intake still says it is alive;
3. a state-changing request from another site's page: 403 (`app.intake.exposure`);
4. an admin route without a valid token: 401 or 403, before a byte of its body is read;
5. a body declared as anything but JSON: 415;
6. the body, read whole, within a size (413) and a time (408) limit;
7. room: at most `limit` requests past their body at once in this process, then 503 with
   `Retry-After`, rather than queueing until the process falls over.

A request takes room only once its whole body is here. A client that trickles a body, or
sends one without valid credentials, costs a connection and at most a body's bytes for at
most the body's time limit, never the room that signed pushes need."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.config.settings import Settings
from app.errors import (
    CrossSite,
    HeadersTooLarge,
    MalformedBody,
    Overloaded,
    PayloadTooLarge,
    PipelineError,
    RequestTimeout,
    UnsupportedMediaType,
)
from app.intake.admin import ACTOR_STATE, AdminRoutes, admin_actor
from app.intake.errors import outcome_for, response_for
from app.intake.exposure import READ_METHODS, cross_site
from app.lines import LineRegistry
from app.telemetry.counters import Counter, Telemetry

EXEMPT_PATHS = frozenset({"/healthz", "/readyz"})
MAX_HEADERS = 100
RETRY_AFTER_S = 1
# One line's requests that wait (for their rate's turn, or to run their record under
# `caller_runs`) take at most this share of the in-flight limit, so that a flood on one
# line cannot fill it and have the other lines answered 503.
LINE_SHARE = 0.25
# The records' route: `POST /v1/{line}`; its refusals here are counted by line.
RECORD_PATH_PREFIX = "/v1/"


class RequestGate:
    """ASGI middleware: the checks above, with the settings' limits."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: Settings,
        admin_routes: AdminRoutes,
        lines: LineRegistry,
        telemetry: Telemetry,
    ) -> None:
        self.app = app
        self.settings = settings
        self.limit = settings.intake_max_concurrent_requests
        self.admin_routes = admin_routes
        self.line_names = frozenset(lines.names())
        self.telemetry = telemetry
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            receive = await self._admit(scope, receive)
        except PipelineError as exc:
            self._count_refusal(scope, exc)
            await _answer(exc, scope, receive, send)
            return
        except _Gone:
            return  # the client left while sending its body: nobody to answer
        if scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            self._count_refusal(scope, Overloaded())
            await _answer(Overloaded(), scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _admit(self, scope: Scope, receive: Receive) -> Receive:
        """The checks 1 to 6; the `receive` that hands the app the body read. Raises the
        refusal's error, or `_Gone`."""
        raw = scope["headers"]
        size = sum(len(name) + len(value) for name, value in raw)
        limit = self.settings.intake_max_header_bytes
        if size > limit or len(raw) > MAX_HEADERS:
            raise HeadersTooLarge(f"headers are over the limit of {limit} bytes or {MAX_HEADERS}")
        if scope["path"] in EXEMPT_PATHS:
            return receive  # they take no body, and no room: answered however busy
        headers = Headers(scope=scope)
        method = scope["method"]
        why = cross_site(method, headers)
        if why is not None:
            raise CrossSite(f"a page of another site may not act on this intake ({why})")
        if self._record_line(scope) is None and self.admin_routes.matches(scope):
            actor = admin_actor(self.settings, headers.get("authorization", ""))
            scope.setdefault("state", {})[ACTOR_STATE] = actor
        if method in READ_METHODS and not _has_body(headers):
            return receive
        _check_media_type(headers)
        body = await _read_body(
            receive,
            declared=headers.get("content-length"),
            limit=self.settings.max_body_bytes,
            timeout_s=self.settings.intake_body_timeout_seconds,
        )
        return _replay(body, receive)

    def _record_line(self, scope: Scope) -> str | None:
        """The line of a `POST /v1/{line}` to a line this intake knows; None for any
        other request."""
        path: str = scope["path"]
        line = path.removeprefix(RECORD_PATH_PREFIX)
        return line if scope["method"] == "POST" and line in self.line_names else None

    def _count_refusal(self, scope: Scope, exc: PipelineError) -> None:
        """A refused `POST /v1/{line}` counts in `pipeline_intake_requests_total`, as the
        route's own refusals do."""
        line = self._record_line(scope)
        outcome = outcome_for(exc)
        if line is not None and outcome is not None:
            self.telemetry.count(Counter.INTAKE, line=line, outcome=outcome.value)


class _Gone(Exception):
    """The client disconnected before its body ended."""


async def _answer(exc: PipelineError, scope: Scope, receive: Receive, send: Send) -> None:
    response = response_for(exc)
    if isinstance(exc, Overloaded):
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
    await response(scope, receive, send)


def _has_body(headers: Mapping[str, str]) -> bool:
    return "transfer-encoding" in headers or headers.get("content-length", "0") != "0"


def _check_media_type(headers: Mapping[str, str]) -> None:
    """A body declared as something else than JSON is refused (a browser's form or its
    `text/plain` fetch among them); one sent without a type goes on (curl, servers)."""
    declared = headers.get("content-type")
    if declared is None or not _has_body(headers):
        return
    media = declared.partition(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise UnsupportedMediaType(
            f"the body is {media or 'of no type'!r}: send JSON, Content-Type application/json"
        )


async def _read_body(
    receive: Receive, *, declared: str | None, limit: int, timeout_s: float
) -> bytes:
    """The whole body, refused with `PayloadTooLarge` as soon as it is declared or grows
    past `limit` bytes, and with `RequestTimeout` when it has not all arrived within
    `timeout_s` (the whole body, not each read: a client sending a byte a second holds a
    connection, never more than this)."""
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise MalformedBody("Content-Length is not a number")
        if int(declared) > limit:
            raise PayloadTooLarge(f"body is over the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Gone
                chunk: bytes = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"body is over the limit of {limit} bytes")
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError:
        raise RequestTimeout(f"the body did not arrive within {timeout_s:g} s") from None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the app `body` whole, then what the client sends next (its
    disconnect)."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
