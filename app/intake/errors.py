"""The one place that maps the error tree (and framework errors) to HTTP answers.

Every error answer is `{"error": {"code", "message"}}`, plus the error's `details`."""

from __future__ import annotations

from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import errors
from app.telemetry.counters import Counter, IntakeOutcome
from app.telemetry.logs import get_logger
from app.wiring.runtime import Runtime

log = get_logger(__name__)
T = TypeVar("T")

# By the nearest class in an error's MRO: the middle categories, and the leaves whose
# status code is not their category's.
STATUS_BY_ERROR: dict[type[errors.PipelineError], int] = {
    errors.Unavailable: 503,
    errors.Invalid: 422,
    errors.MalformedBody: 400,
    errors.RequestTimeout: 408,
    errors.PayloadTooLarge: 413,
    errors.HeadersTooLarge: 431,
    errors.UnsupportedMediaType: 415,
    errors.NotFound: 404,
    errors.Unauthenticated: 401,
    errors.Forbidden: 403,
    # Misdirected Request: this server does not answer for that authority (a name that
    # resolves here, as in DNS rebinding, is not one of its own).
    errors.HostNotAllowed: 421,
    # Misdirected too: another intake takes that line's records.
    errors.LineNotServed: 421,
    errors.Conflict: 409,
    errors.Throttled: 429,
}

# How a refused `POST /v1/{line}` is counted in `pipeline_intake_requests_total`.
OUTCOME_BY_ERROR: dict[type[errors.PipelineError], IntakeOutcome] = {
    errors.Invalid: IntakeOutcome.INVALID,
    errors.NotFound: IntakeOutcome.INVALID,
    errors.LineNotServed: IntakeOutcome.INVALID,
    errors.Unauthenticated: IntakeOutcome.UNAUTHORIZED,
    errors.Conflict: IntakeOutcome.CONFLICT,
    errors.RateLimited: IntakeOutcome.RATE_LIMITED,
    errors.Unavailable: IntakeOutcome.UNAVAILABLE,
}
# Not here: `QueueFull`, counted by the route as `rejected` (the record is kept), and
# `Forbidden`, an admin answer.


def _nearest(table: dict[type[errors.PipelineError], T], exc: errors.PipelineError) -> T | None:
    for cls in type(exc).__mro__:
        if cls in table:
            return table[cls]
    return None


def outcome_for(exc: errors.PipelineError) -> IntakeOutcome | None:
    """How a refusal of `POST /v1/{line}` is counted (None: it is not)."""
    return _nearest(OUTCOME_BY_ERROR, exc)


def status_for(exc: errors.PipelineError) -> int:
    """The HTTP status code that answers `exc` (500: a failure of ours, not the caller's)."""
    status = _nearest(STATUS_BY_ERROR, exc)
    return 500 if status is None else status


def count_outcome(request: Request, outcome: IntakeOutcome) -> None:
    """Count one answer of a route that counts its outcomes (by line, an unknown line as
    `unknown`; its refusals too): one that set `request.state.count_outcomes`."""
    if not getattr(request.state, "count_outcomes", False):
        return
    rt: Runtime = request.app.state.runtime
    line = request.path_params.get("line", "")
    label = line if line in rt.lines.names() else "unknown"
    rt.telemetry.count(Counter.INTAKE, line=label, outcome=outcome.value)


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def response_for(exc: errors.PipelineError) -> JSONResponse:
    """The answer to `exc`: its status code, its code and message (for a 5xx, the class's
    own message unless `message_is_public`: hosts and SQL are for our log), its details
    and its headers."""
    status = status_for(exc)
    message = exc.message
    if status >= 500 and not exc.message_is_public:
        message = (type(exc).__doc__ or "unavailable").strip()
    response = JSONResponse(
        {"error": {"code": exc.code, "message": message}, **exc.details}, status_code=status
    )
    if isinstance(exc, errors.AdminRequired):
        response.headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, errors.Throttled):
        response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


async def _pipeline_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.PipelineError)
    outcome = outcome_for(exc)
    if outcome is not None:
        count_outcome(request, outcome)
    if status_for(exc) >= 500:
        log.error("request_failed", code=exc.code, error=exc.message)
    return response_for(exc)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    where = ".".join(str(part) for part in first.get("loc", ()))
    return error_response(422, "invalid_request", f"{where}: {first.get('msg')}")


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {400: "malformed_body", 404: "not_found", 405: "method_not_allowed"}.get(
        exc.status_code, "http_error"
    )
    return error_response(exc.status_code, code, str(exc.detail))


async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    log.exception("request_crashed", error_type=type(exc).__name__)
    return error_response(500, "internal_error", "internal error")


def install(app: FastAPI) -> None:
    """Register the handlers on `app`."""
    app.add_exception_handler(errors.PipelineError, _pipeline_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
