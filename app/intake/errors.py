"""The one place that maps the error tree (and framework errors) to HTTP answers.

Every error answer is `{"error": {"code", "message"}}` (DESIGN §7)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import errors
from app.logs import get_logger

log = get_logger(__name__)

STATUS_BY_ERROR: dict[type[errors.PipelineError], int] = {
    errors.InvalidPayload: 422,
    errors.PayloadTooLarge: 413,
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


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _status_for(exc: errors.PipelineError) -> int:
    if isinstance(exc, MalformedBody):
        return 400
    for cls in type(exc).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return 500


async def _pipeline_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.PipelineError)
    status = _status_for(exc)
    message = exc.message
    if status >= 500:
        # The details (hosts, SQL) are for our log, not for the caller.
        log.error("request_failed", code=exc.code, error=exc.message)
        message = (type(exc).__doc__ or "unavailable").strip()
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, errors.AdminRequired) else None
    response = error_response(status, exc.code, message)
    if headers:
        response.headers.update(headers)
    return response


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    where = ".".join(str(part) for part in first.get("loc", ()))
    return error_response(422, "invalid_request", f"{where}: {first.get('msg')}")


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
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
