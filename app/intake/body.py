"""Reading and validating a request body: size limit, JSON, the line's schema."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from app.errors import InvalidPayload, PayloadTooLarge
from app.intake.errors import MalformedBody


async def read_body(request: Request, *, limit: int) -> bytes:
    """The raw body, refused with `PayloadTooLarge` as soon as it passes `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise MalformedBody("Content-Length is not a number")
        if int(declared) > limit:
            raise PayloadTooLarge(f"body is over the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_payload(body: bytes, schema: type[BaseModel]) -> dict[str, Any]:
    """The body as a JSON object valid for `schema`, in the schema's canonical form.

    Raises `MalformedBody` (not JSON) or `InvalidPayload` (JSON, not a valid payload)."""
    try:
        data = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise MalformedBody(f"body is not valid JSON: {type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise InvalidPayload("body must be a JSON object")
    if _has_unstorable_text(data):
        raise InvalidPayload("strings may not contain NUL or unpaired surrogates")
    try:
        valid = schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise InvalidPayload(f"{where}: {first['msg']}") from None
    # Stored in canonical form (times as ISO 8601), so sinks read what the schema checked.
    return valid.model_dump(mode="json")


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _has_unstorable_text(value: Any) -> bool:
    """NUL and lone surrogates are valid JSON escapes that no journal can store."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item or any("\ud800" <= ch <= "\udfff" for ch in item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
