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


class Overflow(StrEnum):
    """What admission does when a line's queue is full."""

    DEFER = "defer"
    CALLER_RUNS = "caller_runs"
    REJECT = "reject"


class LineSettings(BaseModel):
    """One business line's settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_queue_length: int = Field(default=10_000, ge=1)
    # Records per queue message, for records pushed together (concurrent requests, a
    # sweep, a replay page). The bound counts messages. Unset: `Line.batch_size` decides.
    batch_size: int | None = Field(default=None, ge=1, le=1000)
    overflow: Overflow = Overflow.DEFER
    # Requests per second each intake process admits for the line; over it, a request
    # waits its turn (app.intake.pacing). Unset: no limit but the intake's own.
    intake_rate: float | None = Field(default=None, gt=0, le=1_000_000)
    concurrency: int = Field(default=4, ge=1, le=256)
    max_attempts: int = Field(default=8, ge=1)
    backoff_initial_s: float = Field(default=2.0, gt=0)
    backoff_max_s: float = Field(default=600.0, gt=0)
    downstream_url: str | None = Field(default=None, pattern=r"^https?://\S+$")
    # The HTTP sink's answers that count as delivered; any other is a failed attempt. Not
    # 409 by default: some downstreams answer it for a key whose first request they are
    # still processing, and that processing may still fail.
    delivered_statuses: str = SUCCESS_CLASS
    # `whsec_<base64 key>`: the HTTP sink signs each delivery as Standard Webhooks do
    # (`webhook-id`, `webhook-timestamp`, `webhook-signature`), so a downstream can check it
    # with any Standard Webhooks library. Unset: deliveries are not signed.
    signing_secret: SecretStr | None = None
    # A delivery's one deadline, from connect to the answer's last byte: a downstream that
    # has not answered whole within it is a failed attempt, retried later.
    delivery_timeout_s: float = Field(default=10.0, gt=0, le=600)
    # Deliveries one worker process keeps in flight (HTTP sink), on one event loop: the
    # records of its messages go out concurrently, each with its own lease, attempt and
    # outcome; waiting on the downstream costs no thread.
    deliveries_in_flight: int = Field(default=128, ge=1, le=1024)
    # Across every worker on every host: deliveries per second (a token bucket in Redis)
    # and deliveries in flight. Unset: no limit.
    delivery_rate: float | None = Field(default=None, gt=0, le=1_000_000)
    delivery_concurrency: int | None = Field(default=None, ge=1, le=100_000)
    # The circuit breaker: when at least `circuit_min_attempts` deliveries ended within
    # the last `circuit_window_s` and most of them failed (5xx or 429, a timeout, no
    # connection), the line stops spending attempts: one probe every
    # `circuit_probe_interval_s`, the others wait; a probe that succeeds closes it.
    circuit_window_s: float = Field(default=30.0, ge=1, le=3600)
    circuit_min_attempts: int = Field(default=10, ge=1)
    circuit_probe_interval_s: float = Field(default=5.0, gt=0, le=3600)
    # Replay asks it whether downstream has a record, named by `{id}` (the Idempotency-Key
    # the HTTP sink sends): 200 yes, 404 no. Not by business number alone: a second record
    # of one business number is not the first.
    check_url: str | None = Field(default=None, pattern=r"^https?://\S+$")
    handler: str | None = None
    # `http`, `handler` or `table:<name>`. Unset: the handler when one is set, else the HTTP
    # sink when `downstream_url` is set, else the table sink into `sink_rows`.
    sink: str | None = None
    payload_schema: str = "app.payloads:Payload"

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
