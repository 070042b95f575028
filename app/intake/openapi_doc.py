"""What the OpenAPI document says about calling the intake, beyond its routes: how a record
is signed (the four headers, as header parameters and a security scheme), the admin bearer
token on the admin endpoints, and the one error body on every error answer. An integrator
learns all of it from `/docs` alone; the texts live in `app.intake.openapi_text`.

The two schemes are FastAPI security dependencies that only declare: they never refuse a
request (the signature is checked after the body is read, the token by `require_admin`,
both with the error tree's answers). Declared on the dependency, the admin scheme reaches
every admin endpoint, whichever router it is in."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from fastapi.security import APIKeyHeader, HTTPBearer

from app.config.settings import Settings
from app.intake import openapi_text as text

SIGNATURE_SCHEME = "requestSignature"
ADMIN_SCHEME = "adminToken"
REQUEST_SIGNATURE = APIKeyHeader(name="X-Signature", scheme_name=SIGNATURE_SCHEME, auto_error=False)
ADMIN_BEARER = HTTPBearer(scheme_name=ADMIN_SCHEME, description=text.ADMIN, auto_error=False)
ERROR_SCHEMA = "ErrorBody"
ERROR_REF = {"$ref": f"#/components/schemas/{ERROR_SCHEMA}"}
# Every endpoint may fail on our side; the fuzz test holds that bad input never does.
INTERNAL_ERROR = {"description": "Internal Server Error: `internal_error`, logged by the intake"}


def describe(app: FastAPI, settings: Settings) -> None:
    """Make `app.openapi()` add the signing, the admin token and the error body to the
    document it builds (once: the document is cached on `app`)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            annotate(document, settings)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def annotate(document: dict[str, Any], settings: Settings) -> None:
    """Add to `document`: the overview, the signing recipe on the signature's scheme and
    the four headers on each signed operation, and the error body on every error answer."""
    signed = not settings.in_dev_mode
    window_s = settings.timestamp_window_seconds
    document["info"]["description"] = text.overview(window_s=window_s, signed=signed)
    schemes = document.setdefault("components", {}).setdefault("securitySchemes", {})
    if SIGNATURE_SCHEME in schemes:
        schemes[SIGNATURE_SCHEME]["description"] = text.signature_scheme(window_s=window_s)
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            if {SIGNATURE_SCHEME: []} in operation.get("security", []):
                _sign(operation, window_s=window_s, required=signed)
            _error_answers(operation)
    _error_schema(document)


def _sign(operation: dict[str, Any], *, window_s: int, required: bool) -> None:
    parameters = [
        {
            "name": name,
            "in": "header",
            "required": required,
            "description": description,
            "schema": schema,
        }
        for name, description, schema in text.signature_headers(window_s=window_s)
    ]
    operation["parameters"] = [*operation.get("parameters", []), *parameters]
    operation["description"] = (
        operation.get("description", "") + "\n\n" + text.SIGNED_OPERATION
    ).strip()


def _error_answers(operation: dict[str, Any]) -> None:
    """Every error answer of `operation` carries the error body; 429 says `Retry-After`."""
    responses = operation.setdefault("responses", {})
    responses.setdefault("500", dict(INTERNAL_ERROR))
    for status, answer in responses.items():
        if not (status.isdigit() and int(status) >= 400):
            continue
        answer["content"] = {"application/json": {"schema": ERROR_REF}}
        if status == "429":
            answer["headers"] = {"Retry-After": text.RETRY_AFTER_HEADER}


def _error_schema(document: dict[str, Any]) -> None:
    """The error body, in place of the bare one the route models give; their inner model
    goes too once nothing refers to it."""
    schemas = document["components"].setdefault("schemas", {})
    schemas[ERROR_SCHEMA] = text.ERROR_BODY
    inner = schemas.pop("ErrorDetail", None)
    if inner is not None and "#/components/schemas/ErrorDetail" in json.dumps(document):
        schemas["ErrorDetail"] = inner


# What `POST /v1/{line}` takes, for the OpenAPI document (the body is read raw to sign it).
RECORD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["business_no"],
                    "properties": {"business_no": {"type": "string", "maxLength": 128}},
                    "additionalProperties": True,
                }
            }
        },
    }
}
