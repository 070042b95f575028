"""One business line's settings: its queue's bound and overflow, its workers, its retry
policy, its sink, and its delivery path toward a downstream (concurrency within a worker,
the global rate and concurrency limits, the circuit breaker)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from app import standard_webhooks
from app.config.sink_settings import (
    CHECK_URL_ID,
    DEFAULT_SINK_TABLE,
    SUCCESS_CLASS,
    DeliveredStatuses,
    Sink,
    SinkKind,
)

# A line's `fair_share` unset: a few messages' worth of records, so that a sender within it
# waits behind a few messages of each other sender at most (app.admission.senders).
DEFAULT_FAIR_SHARE = 100


class Overflow(StrEnum):
    """What admission does when a line's queue is full."""

    DEFER = "defer"
    CALLER_RUNS = "caller_runs"
    REJECT = "reject"


class LineSettings(BaseModel):
    """One business line's settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_queue_length: int = Field(
        default=10_000,
        ge=1,
        description="records in the line's Redis queue (named after the line), waiting or held "
        "by a worker until it acks, however many messages carry them; never exceeded",
    )
    sender_queue_share: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="the part of `MAX_QUEUE_LENGTH` one sender's records may take: past it, "
        "that sender's records overflow (by the line's policy) while the other senders' "
        "still go on the queue (see [Senders and fair shares]"
        "(operating.md#senders-and-fair-shares))",
    )
    fair_share: int = Field(
        default=DEFAULT_FAIR_SHARE,
        ge=1,
        description="records of one sender (an intake key id) the line's workers take ahead "
        "of every sender past its own; past it, the sender's records wait behind theirs, "
        "in arrival order (see [Senders and fair shares](operating.md#senders-and-fair-shares))",
    )
    # Only records pushed together share a message (concurrent requests, a sweep, a replay
    # page). Unset: `Line.batch_size` decides.
    batch_size: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="records a queue message may carry (see [Batches](operating.md#batches))",
        json_schema_extra={
            "unset": "`16` with the built-in table sink, `32` with the HTTP sink "
            "(`DELIVERIES_IN_FLIGHT` if fewer), else `1`"
        },
    )
    overflow: Overflow = Field(
        default=Overflow.DEFER,
        description="when full: `defer` (journal keeps it, the sweeper drains it), "
        "`caller_runs`, `reject` (429) (see [Overload](operating.md#overload))",
    )
    # Unset: no limit but the intake's own (app.intake.pacing).
    intake_rate: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description="requests/s each intake process admits for the line; over it a request "
        "waits its turn (see [Overload](operating.md#overload))",
    )
    # Unset: a sender may take all of its line's rate (app.intake.pacing).
    sender_intake_rate: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description="requests/s each intake process admits for the line from any one sender "
        "(the key id a request is signed with; `dev` in dev mode); over it a request waits "
        "its turn or is answered 429 `rate_limited` with `Retry-After`, like `intake_rate` "
        "(see [Overload](operating.md#overload))",
        json_schema_extra={"unset": "no per-sender limit"},
    )
    concurrency: int = Field(
        default=4,
        ge=1,
        le=256,
        description="worker pool size (prefork processes); an HTTP-sink line's worker is one "
        "process that keeps `DELIVERIES_IN_FLIGHT` deliveries in flight instead (see "
        "[The delivery path](operating.md#the-delivery-path))",
    )
    max_attempts: int = Field(
        default=8, ge=1, description="tries in all; then the record is `dead`"
    )
    backoff_initial_s: float = Field(
        default=2.0,
        gt=0,
        description="full-jitter exponential backoff between attempts: its first step",
    )
    backoff_max_s: float = Field(
        default=600.0,
        gt=0,
        description="full-jitter exponential backoff between attempts: its longest step",
    )
    downstream_url: str | None = Field(
        default=None,
        pattern=r"^https?://\S+$",
        description="set: POST `{id, line, business_no, payload}` there with "
        "`Idempotency-Key: <id>` and `X-Attempt: <attempt number>`; an answer in "
        "`DELIVERED_STATUSES` is delivered, any other (or none in time) is a failed attempt",
    )
    # Not 409 by default: some downstreams answer it for a key whose first request they are
    # still processing, and that processing may still fail.
    delivered_statuses: str = Field(
        default=SUCCESS_CLASS,
        description="comma-separated `2xx` and/or exact codes of 200-499, e.g. `2xx,409`. 409 "
        "is not delivered by default: some downstreams answer it for a key whose first "
        "request they are still processing, which may yet fail; add it only where 409 means "
        '"already have it"',
    )
    # Standard Webhooks' scheme, so that a downstream can check a delivery with any Standard
    # Webhooks library. Unset: deliveries are not signed.
    signing_secret: SecretStr | None = Field(
        default=None,
        description="`whsec_` and the base64 of a key of at least 24 bytes: the HTTP sink "
        "signs each delivery as Standard Webhooks do, over the exact bytes sent: `webhook-id` "
        "(the record id, as `Idempotency-Key`), `webhook-timestamp` (the attempt's time) and "
        "`webhook-signature: v1,<base64>`; only on a line with the HTTP sink; never logged",
    )
    delivery_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="a delivery's one deadline, from connect to the answer's last byte (for a "
        "handler, to its return): past it the attempt fails, however the downstream trickles; "
        "settings that would let a delivery outlive its lease are refused at start",
    )
    # The records of a worker's messages go out concurrently, each with its own lease,
    # attempt and outcome.
    deliveries_in_flight: int = Field(
        default=128,
        ge=1,
        le=1024,
        description="HTTP sink: deliveries one worker process keeps in flight, on one event "
        "loop (waiting on the downstream costs no thread)",
    )
    # A handler's thread cannot be stopped: one that overruns its deadline runs on, and
    # holds a thread until it returns. 16: a handful of hung calls leave room for the rest.
    handler_threads: int = Field(
        default=16,
        ge=1,
        le=256,
        description="handler sink: threads of the line's handler in one worker process. "
        "Calls run one at a time, each within `DELIVERY_TIMEOUT_S`; a call that overruns "
        "keeps its thread until it returns, and no new attempt starts without a free one "
        "(records wait, no attempt spent; `HANDLER_STUCK` when none is free)",
    )
    # Unset, this and `delivery_concurrency` below limit nothing.
    delivery_rate: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description="HTTP sink: deliveries per second to the downstream, across every worker "
        "on every host (a token bucket in Redis)",
    )
    delivery_concurrency: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="HTTP sink: deliveries in flight to the downstream, across every worker on "
        "every host",
    )
    # The circuit breaker. A failed delivery is a 5xx or 429, a timeout or no connection; a
    # probe that succeeds closes the circuit.
    circuit_window_s: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        description="HTTP sink: when at least `CIRCUIT_MIN_ATTEMPTS` deliveries ended in the "
        "last `CIRCUIT_WINDOW_S` seconds and most failed, the line's circuit opens: one probe "
        "every `CIRCUIT_PROBE_INTERVAL_S`, no attempt spent meanwhile",
    )
    circuit_min_attempts: int = Field(
        default=10,
        ge=1,
        description="HTTP sink: the deliveries that must have ended within `CIRCUIT_WINDOW_S` "
        "before the circuit may open",
    )
    circuit_probe_interval_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="HTTP sink: while the circuit is open, one probe goes every this many seconds",
    )
    # By the record's id, not by business number alone: a second record of one business
    # number is not the first.
    check_url: str | None = Field(
        default=None,
        pattern=r"^https?://\S+$",
        description="e.g. `http://host/records/{id}`: replay asks it whether downstream has a "
        "record (200 yes, 404 no), by the record's id (the `Idempotency-Key` the HTTP sink "
        "sends); it must hold `{id}`, and may hold `{business_no}` as well",
    )
    handler: str | None = Field(
        default=None,
        description="dotted path of a callable `(record) -> None`, idempotent",
    )
    sink: str | None = Field(
        default=None,
        description="where the line's records go: `http` (POST to `DOWNSTREAM_URL`), "
        "`handler` (call `HANDLER`), or `table:<name>` (upsert into a table of the journal's "
        "database: `orders`, `refunds`, `order_status` or `sink_rows`)",
        json_schema_extra={"unset": "see below"},
    )
    payload_schema: str = Field(
        default="app.payloads:Payload",
        description="dotted path of a pydantic model the body must match",
    )

    @field_validator("check_url")
    @classmethod
    def _check_url_names_the_record(cls, value: str | None) -> str | None:
        if value is not None and CHECK_URL_ID not in value:
            raise ValueError(
                f"must name the record by {CHECK_URL_ID} (the record id), e.g. "
                f"http://host/records/{CHECK_URL_ID}; {{business_no}} may appear as well"
            )
        return value

    @field_validator("signing_secret")
    @classmethod
    def _whsec_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            standard_webhooks.decode_secret(value.get_secret_value())
        return value

    @field_validator("delivered_statuses")
    @classmethod
    def _delivered_statuses(cls, value: str) -> str:
        return str(DeliveredStatuses.parse(value))

    @property
    def delivered(self) -> DeliveredStatuses:
        """`delivered_statuses`, parsed."""
        return DeliveredStatuses.parse(self.delivered_statuses)

    @field_validator("sink")
    @classmethod
    def _sink(cls, value: str | None) -> str | None:
        return None if value is None else str(Sink.parse(value))

    @model_validator(mode="after")
    def _sink_has_what_it_needs(self) -> LineSettings:
        kind = self.resolved_sink.kind
        if kind is SinkKind.HTTP and not self.downstream_url:
            raise ValueError("sink http needs downstream_url")
        if kind is SinkKind.HANDLER and not self.handler:
            raise ValueError("sink handler needs handler (a dotted path)")
        if kind is not SinkKind.HANDLER and self.handler:
            raise ValueError(f"handler is set but sink is {self.sink}")
        if kind is not SinkKind.HTTP and self.signing_secret is not None:
            raise ValueError(
                f"signing_secret signs the HTTP sink's deliveries, but the sink is {kind.value}"
            )
        return self

    @property
    def resolved_sink(self) -> Sink:
        """The sink the line uses: `sink`, or the one its other settings imply."""
        if self.sink is not None:
            return Sink.parse(self.sink)
        if self.handler:
            return Sink(kind=SinkKind.HANDLER)
        if self.downstream_url:
            return Sink(kind=SinkKind.HTTP)
        return Sink(kind=SinkKind.TABLE, table=DEFAULT_SINK_TABLE)


# The longest a claimed record waits for room under its line's limits before it is given
# back: a quarter of its lease, and this at most (the message ends well within its lease).
MAX_LIMIT_WAIT_S = 30.0


def limit_wait_s(lease_s: float) -> float:
    """The longest a delivery waits for room under its line's limits, for a lease of
    `lease_s`."""
    return min(MAX_LIMIT_WAIT_S, lease_s / 4)


def longest_delivery_s(settings: LineSettings, *, lease_s: float) -> float:
    """The longest one delivery of a line takes, from its claim: its wait for room, then
    its request, whose one deadline (`delivery_timeout_s`) runs from connect to last byte,
    and a second's margin."""
    return limit_wait_s(lease_s) + settings.delivery_timeout_s + 1
