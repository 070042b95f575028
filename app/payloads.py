"""Payload schemas of the built-in lines. A line names its schema by dotted path."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.clock import as_utc

# A business number is an identifier, not free text (1 to 128 characters): no
# control characters, and nothing that reads as a path (it goes into URLs and file names
# downstream): no slash or backslash, and not "." or "..". The pattern is for the OpenAPI
# document; a payload that breaks it is told so in words (`BUSINESS_NO_RULE`).
BUSINESS_NO_PATTERN = r"^[^\x00-\x1f\x7f/\\]{1,128}$"
MAX_BUSINESS_NO_LENGTH = 128  # the journal's column
BUSINESS_NO_RULE = (
    f"a business number is 1 to {MAX_BUSINESS_NO_LENGTH} characters, without control "
    "characters (such as a newline or a tab), '/' or '\\', and is not '.' or '..'"
)


def business_no_problem(value: str) -> str | None:
    """What is wrong with `value` as a business number, in words; None when nothing is."""
    if not value:
        return "is empty"
    if len(value) > MAX_BUSINESS_NO_LENGTH:
        return f"has {len(value)} characters"
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        return "has a control character"
    if "/" in value or "\\" in value:
        return "has a '/' or '\\'"
    if value in (".", ".."):
        return f"is {value!r}"
    return None


class Payload(BaseModel):
    """Any JSON object with a `business_no`."""

    model_config = ConfigDict(extra="allow")

    business_no: str = Field(
        json_schema_extra={
            "minLength": 1,
            "maxLength": MAX_BUSINESS_NO_LENGTH,
            "pattern": BUSINESS_NO_PATTERN,
            "not": {"enum": [".", ".."]},
        },
    )

    @field_validator("business_no")
    @classmethod
    def _an_identifier(cls, value: str) -> str:
        problem = business_no_problem(value)
        if problem is not None:
            raise ValueError(f"{problem}; {BUSINESS_NO_RULE}")
        return value


class StatusPayload(Payload):
    """An order-status change: the newest `occurred_at` wins."""

    status: str = Field(min_length=1, max_length=64)
    occurred_at: datetime  # naive times are taken as UTC

    @field_validator("occurred_at")
    @classmethod
    def _representable_in_utc(cls, value: datetime) -> datetime:
        try:
            as_utc(value)
        except OverflowError:
            raise ValueError("occurred_at is out of range") from None
        return value
