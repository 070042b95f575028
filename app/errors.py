"""The pipeline's one error tree.

    PipelineError
    ├── ConfigError              a setting is invalid; the process must not start
    ├── Unavailable              something it needs does not answer now: try again later
    │   ├── JournalUnavailable   the journal database cannot be reached or written
    │   │   └── JournalInDoubt   a commit gave no outcome: what it wrote may be kept
    │   ├── BrokerUnavailable    Redis cannot be reached
    │   ├── Overloaded           the intake has too many requests in flight
    │   ├── ShuttingDown         the process is stopping
    │   └── NotReady             a readiness check failed (names what)
    ├── Invalid                  the request itself is wrong: sending it again will not help
    │   ├── InvalidPayload       the body is not a valid payload for its line
    │   │   └── MalformedBody    the body is not JSON
    │   ├── PayloadTooLarge      the body is over the size limit
    │   ├── HeadersTooLarge      the request's headers are over the limit
    │   ├── RequestTimeout       the body did not arrive in time
    │   ├── UnsupportedMediaType the body is not declared as JSON
    │   ├── InvalidSchedule      a schedule's cron, zone, line or payload is invalid
    │   └── InvalidFilter        a filter of records is contradictory or empty where one is needed
    ├── NotFound                 what the request names does not exist
    │   ├── UnknownLine          no business line has that name
    │   ├── RecordNotFound       no journal record has that id
    │   └── ScheduleNotFound     no schedule has that name
    ├── Refused                  the request is understood and refused
    │   ├── Unauthenticated      who sent it is not known
    │   │   ├── BadSignature     the request's signature is missing or invalid
    │   │   └── AdminRequired    an admin endpoint was called without a token
    │   │       └── AdminNotConfigured  none is configured: the admin endpoints are closed
    │   ├── Forbidden            the caller may not do this
    │   │   ├── AdminForbidden   an admin endpoint was called with a wrong token
    │   │   ├── NotLoopback      dev mode, and the client is not on this machine
    │   │   └── CrossSite        a page of another site sent a state-changing request
    │   ├── HostNotAllowed       dev mode, and the request's Host is not a loopback name
    │   ├── Conflict             the request conflicts with what is stored
    │   │   ├── NonceReused      a known nonce came back with another body or line
    │   │   ├── RecordInFlight   an operator's action met a record an attempt or a queue holds
    │   │   └── RecordStatusConflict  the record's status does not take that action
    │   └── Throttled            try again after `retry_after_s`
    │       ├── RateLimited      a line's requests are over its intake rate
    │       └── QueueFull        a line's queue is full under `reject` (the record is kept)
    ├── DeliveryFailed           a sink could not deliver a record (the attempt failed)
    ├── AttemptsOverran          a message's attempts did not end within their bound (says on what)
    └── UnboundedPublish         a pipeline task was published around the bounded push

A class's docstring is its default message. The HTTP layer maps the middle categories
(and the few leaves whose status code differs from theirs) to status codes in one place
(`app.intake.errors`); nothing below it knows about HTTP. `details` are fields an answer
carries beside the error (a rejected record's id, the checks that failed).
"""

from __future__ import annotations


class PipelineError(Exception):
    """The pipeline failed."""

    code = "pipeline_error"
    # Whether the message may be shown to a caller even when it is our failure (a 5xx):
    # only where we wrote it from nothing but the failure's name.
    message_is_public = False

    def __init__(self, message: str | None = None, **details: object) -> None:
        # A docstring that runs over lines is one line of message.
        super().__init__(message or " ".join((self.__doc__ or "").split()))
        self.details = details

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(PipelineError):
    """A setting is invalid."""

    code = "config_error"


class Unavailable(PipelineError):
    """The service is unavailable; try again later."""

    code = "unavailable"


class Invalid(PipelineError):
    """The request is invalid."""

    code = "invalid_request"


class NotFound(PipelineError):
    """Not found."""

    code = "not_found"


class Refused(PipelineError):
    """The request was refused."""

    code = "refused"


class Unauthenticated(Refused):
    """The request is not authenticated."""

    code = "unauthenticated"


class Forbidden(Refused):
    """The request is not allowed."""

    code = "forbidden"


class Conflict(Refused):
    """The request conflicts with what is stored."""

    code = "conflict"


class Throttled(Refused):
    """Too many requests; try again after `retry_after_s` seconds."""

    code = "throttled"

    def __init__(
        self, message: str | None = None, *, retry_after_s: int = 1, **details: object
    ) -> None:
        super().__init__(message, **details)
        self.retry_after_s = retry_after_s


class JournalUnavailable(Unavailable):
    """The journal is unavailable; nothing was accepted."""

    code = "journal_unavailable"


class JournalInDoubt(JournalUnavailable):
    """The journal did not confirm the write in time, and it may still have been kept: send
    the same request again, with the same nonce (it is stored once)."""

    code = "journal_in_doubt"


class BrokerUnavailable(Unavailable):
    """Redis is unavailable."""

    code = "broker_unavailable"


class UnboundedPublish(PipelineError):
    """Pipeline tasks are published only through the bounded push (app.admission.push)."""

    code = "unbounded_publish"


class UnknownLine(NotFound):
    """No business line has that name."""

    code = "unknown_line"


class InvalidPayload(Invalid):
    """The body is not a valid payload."""

    code = "invalid_payload"


class PayloadTooLarge(Invalid):
    """The body is over the size limit."""

    code = "payload_too_large"


class MalformedBody(InvalidPayload):
    """The body is not valid JSON."""

    code = "malformed_body"


class RequestTimeout(Invalid):
    """The request's body did not arrive in time."""

    code = "request_timeout"


class UnsupportedMediaType(Invalid):
    """The body must be JSON: send it with Content-Type application/json."""

    code = "unsupported_media_type"


class HeadersTooLarge(Invalid):
    """The request's headers are over the limit."""

    code = "headers_too_large"


class Overloaded(Unavailable):
    """Too many requests are in flight; try again shortly."""

    code = "overloaded"


class RateLimited(Throttled):
    """This line's requests are over its intake rate; nothing was accepted, try again."""

    code = "rate_limited"


class ShuttingDown(Unavailable):
    """The process is stopping; nothing was accepted."""

    code = "shutting_down"


class NotReady(Unavailable):
    """Not ready."""

    code = "not_ready"
    message_is_public = True


class QueueFull(Throttled):
    """The line's queue is full; the record is kept as rejected, send it again later."""

    code = "queue_full"


class BadSignature(Unauthenticated):
    """The request signature is missing or invalid."""

    code = "bad_signature"


class NonceReused(Conflict):
    """This nonce was already used with a different body."""

    code = "nonce_reused"


class AdminRequired(Unauthenticated):
    """A bearer token is required: Authorization: Bearer <admin token>."""

    code = "admin_required"


class AdminNotConfigured(AdminRequired):
    """No admin token is configured, so the admin endpoints are closed: set
    PIPELINE_ADMIN_TOKEN, or named tokens in PIPELINE_ADMIN_TOKENS (a JSON object of name
    to token), and restart the intake."""

    code = "admin_not_configured"


class AdminForbidden(Forbidden):
    """The admin token is not valid."""

    code = "admin_forbidden"


class NotLoopback(Forbidden):
    """The intake is in dev mode: it answers clients on its own machine only."""

    code = "not_loopback"


class CrossSite(Forbidden):
    """A page of another site may not act on this intake."""

    code = "cross_site_request"


class LineNotServed(Refused):
    """This intake does not take that line's records (PIPELINE_INTAKE_LINES): another
    intake does."""

    code = "line_not_served_here"


class HostNotAllowed(Refused):
    """The intake is in dev mode: it answers requests whose Host is localhost, 127.0.0.1
    or [::1] only."""

    code = "host_not_allowed"


class RecordNotFound(NotFound):
    """No record has that id."""

    code = "record_not_found"


class InvalidSchedule(Invalid):
    """The schedule is invalid."""

    code = "invalid_schedule"


class InvalidFilter(Invalid):
    """The filter of records is invalid."""

    code = "invalid_filter"


class RecordInFlight(Conflict):
    """The record is in flight: an attempt holds its lease, or its message is on its queue."""

    code = "record_in_flight"


class RecordStatusConflict(Conflict):
    """The record's status does not take this action."""

    code = "record_status_conflict"


class ScheduleNotFound(NotFound):
    """No schedule has that name."""

    code = "schedule_not_found"


class DeliveryFailed(PipelineError):
    """The sink could not deliver the record."""

    code = "delivery_failed"


class AttemptsOverran(PipelineError):
    """A message's attempts did not end within their bound; they go on, and settle their
    records themselves."""

    code = "attempts_overran"
