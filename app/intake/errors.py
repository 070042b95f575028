"""The one place that maps the error tree (and framework errors) to HTTP answers.

Every error answer is `{"error": {"code", "message"}}` (DESIGN §7)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import errors
from app.logs import get_logger
from app.observe.telemetry import Counter, Outcome
from app.runtime import Runtime

log = get_logger(__name__)

STATUS_BY_ERROR: dict[type[errors.PipelineError], int] = {
    errors.InvalidPayload: 422,
    errors.PayloadTooLarge: 413,
    errors.RequestTimeout: 408,
    errors.HeadersTooLarge: 431,
    errors.Overloaded: 503,
    errors.RateLimited: 429,
    errors.BadSignature: 401,
    errors.AdminRequired: 401,
    errors.AdminForbidden: 403,
    errors.UnknownLine: 404,
    errors.RecordNotFound: 404,
    errors.NonceReused: 409,
    errors.JournalUnavailable: 503,
    errors.BrokerUnavailable: 503,
}


class MalformedBody(errors.InvalidPayload):
    """The body is not valid JSON."""

    code = "malformed_body"


# How a refused `POST /v1/{line}` is counted in `pipeline_intake_requests_total`.
OUTCOME_BY_STATUS = {
    400: Outcome.INVALID,
    404: Outcome.INVALID,
    408: Outcome.INVALID,
    413: Outcome.INVALID,
    422: Outcome.INVALID,
    401: Outcome.UNAUTHORIZED,
    409: Outcome.CONFLICT,
    429: Outcome.RATE_LIMITED,
    503: Outcome.UNAVAILABLE,
}
# The endpoint whose answers are counted by outcome.
COUNTED_ENDPOINT = "post_record"


def count_outcome(request: Request, outcome: Outcome) -> None:
    """Count one answer of `POST /v1/{line}`; an unknown line is counted as `unknown`."""
    endpoint = request.scope.get("endpoint")
    if getattr(endpoint, "__name__", None) != COUNTED_ENDPOINT:
        return
    rt: Runtime = request.app.state.runtime
    line = request.path_params.get("line", "")
    label = line if line in rt.lines.names() else "unknown"
    rt.telemetry.count(Counter.INTAKE, line=label, outcome=outcome.value)


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _status_for(exc: errors.PipelineError) -> int:
    if isinstance(exc, MalformedBody):
        return 400
    for cls in type(exc).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return 500


async def _pipeline_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.PipelineError)
    status = _status_for(exc)
    if status in OUTCOME_BY_STATUS:
        count_outcome(request, OUTCOME_BY_STATUS[status])
    message = exc.message
    if status >= 500:
        # The details (hosts, SQL) are for our log, not for the caller.
        log.error("request_failed", code=exc.code, error=exc.message)
        message = (type(exc).__doc__ or "unavailable").strip()
    response = error_response(status, exc.code, message)
    if isinstance(exc, errors.AdminRequired):
        response.headers["WWW-Authenticate"] = "Bearer"
    elif isinstance(exc, errors.RateLimited):
        response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


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
