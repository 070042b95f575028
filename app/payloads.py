"""Payload schemas of the built-in lines. A line names its schema by dotted path."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.clock import as_utc

# A business number is an identifier, not free text (1 to 128 characters): no
# control characters, and nothing that reads as a path (it goes into URLs and file names
# downstream): no slash or backslash, and not "." or "..".
BUSINESS_NO_PATTERN = r"^[^\x00-\x1f\x7f/\\]{1,128}$"


class Payload(BaseModel):
    """Any JSON object with a `business_no`."""

    model_config = ConfigDict(extra="allow")

    business_no: str = Field(
        min_length=1,
        max_length=128,
        pattern=BUSINESS_NO_PATTERN,
        json_schema_extra={"not": {"enum": [".", ".."]}},
    )

    @field_validator("business_no")
    @classmethod
    def _not_a_path_segment(cls, value: str) -> str:
        if value in (".", ".."):
            raise ValueError("business_no may not be '.' or '..'")
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
