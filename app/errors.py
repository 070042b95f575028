"""The pipeline's one error tree.

    PipelineError
    ├── ConfigError            a setting is invalid; the process must not start
    ├── JournalUnavailable     the journal database cannot be reached or written
    ├── BrokerUnavailable      Redis cannot be reached
    ├── UnboundedPublish       a pipeline task was published around bounded admission
    ├── UnknownLine            no business line has that name
    ├── InvalidPayload         the body is not a valid payload for its line
    ├── PayloadTooLarge        the body is over the size limit
    ├── RequestTimeout         the body did not arrive in time
    ├── HeadersTooLarge        the request's headers are over the limit
    ├── Overloaded             the intake has too many requests in flight
    ├── RateLimited            a line's requests are over its intake rate
    ├── BadSignature           the request is not authenticated
    ├── NonceReused            a known nonce came back with a different body
    ├── AdminRequired          an admin endpoint was called without a token
    ├── AdminForbidden         an admin endpoint was called with a wrong token
    ├── RecordNotFound         no journal record has that id
    ├── InvalidSchedule        a schedule's cron, zone, line or payload is invalid
    ├── ScheduleNotFound       no schedule has that name
    └── DeliveryFailed         a sink could not deliver a record (the attempt failed)

A class's docstring is its default message. The HTTP layer maps the tree to status
codes in one place (`app.intake.errors`); nothing below it knows about HTTP.
"""

from __future__ import annotations


class PipelineError(Exception):
    """The pipeline failed."""

    code = "pipeline_error"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(PipelineError):
    """A setting is invalid."""

    code = "config_error"


class JournalUnavailable(PipelineError):
    """The journal is unavailable; nothing was accepted."""

    code = "journal_unavailable"


class BrokerUnavailable(PipelineError):
    """Redis is unavailable."""

    code = "broker_unavailable"


class UnboundedPublish(PipelineError):
    """Pipeline tasks are published only through bounded admission (app.delivery.push)."""

    code = "unbounded_publish"


class UnknownLine(PipelineError):
    """No business line has that name."""

    code = "unknown_line"


class InvalidPayload(PipelineError):
    """The body is not a valid payload."""

    code = "invalid_payload"


class PayloadTooLarge(PipelineError):
    """The body is over the size limit."""

    code = "payload_too_large"


class RequestTimeout(PipelineError):
    """The request's body did not arrive in time."""

    code = "request_timeout"


class HeadersTooLarge(PipelineError):
    """The request's headers are over the limit."""

    code = "headers_too_large"


class Overloaded(PipelineError):
    """Too many requests are in flight; try again shortly."""

    code = "overloaded"


class RateLimited(PipelineError):
    """This line's requests are over its intake rate; nothing was accepted, try again."""

    code = "rate_limited"

    def __init__(self, message: str | None = None, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BadSignature(PipelineError):
    """The request signature is missing or invalid."""

    code = "bad_signature"


class NonceReused(PipelineError):
    """This nonce was already used with a different body."""

    code = "nonce_reused"


class AdminRequired(PipelineError):
    """An admin token is required."""

    code = "admin_required"


class AdminForbidden(PipelineError):
    """The admin token is not valid."""

    code = "admin_forbidden"


class RecordNotFound(PipelineError):
    """No record has that id."""

    code = "record_not_found"


class InvalidSchedule(PipelineError):
    """The schedule is invalid."""

    code = "invalid_schedule"


class ScheduleNotFound(PipelineError):
    """No schedule has that name."""

    code = "schedule_not_found"


class DeliveryFailed(PipelineError):
    """The sink could not deliver the record."""

    code = "delivery_failed"
