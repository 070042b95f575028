"""Validating a request body (read whole, within its limits, by `app.intake.gate`): JSON,
the line's schema."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from pydantic import BaseModel, ValidationError

from app.errors import InvalidPayload, MalformedBody

# Our own reasons for refusing a body, worth telling the client.
_OURS = re.compile(r"^(an object has a key twice|a number is out of range|\w+ is not valid JSON)$")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: valid JSON, but no journal can store it
        raise ValueError("a number is out of range")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):  # which value counts would depend on the parser
        raise ValueError("an object has a key twice")
    return found


_DECODER = json.JSONDecoder(
    parse_constant=_refuse_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys
)


def parse_payload(body: bytes, schema: type[BaseModel]) -> dict[str, Any]:
    """The body as a JSON object valid for `schema`, in the schema's canonical form.

    Raises `MalformedBody` (not JSON) or `InvalidPayload` (JSON, not a valid payload)."""
    try:
        # As `json.loads(body)` reads bytes (UTF-8, -16 or -32, a BOM dropped), with one
        # decoder made once rather than one per request.
        data = _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except RecursionError:
        raise MalformedBody("body is not valid JSON: nested too deeply") from None
    except ValueError as exc:
        reason = str(exc) if _OURS.search(str(exc)) else ""
        raise MalformedBody(f"body is not valid JSON{': ' + reason if reason else ''}") from None
    if not isinstance(data, dict):
        raise InvalidPayload("body must be a JSON object")
    if _has_unstorable_text(data):
        raise InvalidPayload("strings may not contain NUL or unpaired surrogates")
    try:
        valid = schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        # Our validators' sentences as they are, without pydantic's "Value error, ".
        message = "is required" if first["type"] == "missing" else first["msg"]
        raise InvalidPayload(f"{where}: {message.removeprefix('Value error, ')}") from None
    # Stored in canonical form (times as ISO 8601), so sinks read what the schema checked.
    return valid.model_dump(mode="json")


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
