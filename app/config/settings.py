"""Configuration: environment variables prefixed `PIPELINE_` (nested with `__`), optionally
a TOML file named by `PIPELINE_CONFIG`. `load_settings()` is the only way in; it turns
any invalid value into one `ConfigError` line that names the variable (and, for one no
setting reads, the known variable closest to it: `closest_known`)."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings.exceptions import SettingsError

from app.config.credentials import (
    SINGLE_TOKEN_ACTOR,
    IntakeKey,
    check_flower_credential,
    check_named_tokens,
    check_single_token,
    parse_intake_keys,
)
from app.config.database_url import check_database_url
from app.config.line_settings import LineSettings, limit_wait_s, longest_delivery_s
from app.config.redis import check_redis_url
from app.config.sink_settings import SinkKind
from app.errors import ConfigError

ENV_PREFIX = "PIPELINE_"
# Between the parts of a nested setting's variable: PIPELINE_LINES__ORDER__MAX_ATTEMPTS.
NESTED = "__"
# How alike a name must be to be offered as the one meant (difflib's ratio; its own default).
CLOSE_ENOUGH = 0.6
LINE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# The intake's own paths under /v1/: a line of one of these names could not be posted to
# (`POST /v1/replay` is the replay), and its pushes would be taken for admin requests.
RESERVED_LINE_NAMES = frozenset(
    {"alerts", "audit", "health", "lines", "records", "replay", "schedules", "throughput"}
)
# The worker's blocking fetch (BRPOP) returns within this, below the socket timeout, so a
# connection a proxy dropped silently is noticed instead of blocking forever.
BRPOP_TIMEOUT_S = 1
# The intake's body size limit unless set: 1 MiB.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
# Retention's days, in the seconds of the signature's window.
SECONDS_PER_DAY = 24 * 60 * 60


class WebhookKind(StrEnum):
    """The chat webhooks alerts can go to."""

    GENERIC = "generic"
    DINGTALK = "dingtalk"
    SLACK = "slack"


class WebhookSettings(BaseModel):
    """One alert destination."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: WebhookKind
    url: str = Field(pattern=r"^https?://\S+$")
    secret: SecretStr | None = None


DEFAULT_LINES: dict[str, dict[str, Any]] = {
    "order": {"sink": "table:orders"},
    "refund": {"sink": "table:refunds"},
    "status": {"payload_schema": "app.payloads:StatusPayload", "sink": "table:order_status"},
}
# A line's settings that choose its sink: given one of them, a default line's own table
# sink gives way (a `downstream_url` alone makes it an HTTP line, as it does any line).
_SINK_CHOICE = ("sink", "handler", "downstream_url")


class Settings(BaseSettings):
    """Everything the pipeline's processes read at start."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=NESTED,
        extra="ignore",
        frozen=True,
        # An error's input may be a secret: `load_settings` prints the message alone, and a
        # ValidationError raised elsewhere does not print the input either.
        hide_input_in_errors=True,
    )

    redis_url: Annotated[str, AfterValidator(check_redis_url)] = Field(
        default="redis://127.0.0.1:6379/0",
        description="broker; password and db in the URL; "
        "`sentinel://h1:26379,h2:26379/0?master=NAME` for Redis behind Sentinel (see "
        "[Scaling](operating.md#scaling))",
    )
    database_url: Annotated[str, AfterValidator(check_database_url)] = Field(
        default="sqlite:///./pipeline.db",
        description="the journal; `postgresql+psycopg://…` in production; a SQLite journal "
        "must be a file that can use WAL (an in-memory `sqlite://` is refused at start)",
    )
    intake_host: str = Field(
        default="127.0.0.1", description="where the intake listens: its address"
    )
    intake_port: int = Field(
        default=8000, ge=0, le=65535, description="where the intake listens: its port"
    )
    intake_workers: int = Field(default=1, ge=1, le=64, description="intake server processes")
    # An intake per group of lines keeps a flood of one line off the CPU of another's.
    intake_lines: list[str] | None = Field(
        default=None,
        description="comma-separated lines whose records this intake takes; another line's "
        '`POST` is 421 `line_not_served_here` (see "A flood on one line" in '
        "[Scaling](operating.md#scaling))",
        json_schema_extra={"unset": "all"},
    )
    nice: int = Field(
        default=0,
        ge=0,
        le=19,
        description="an intake, worker or beat started with it lowers its CPU priority to this "
        "(0 to 19, as `nice`): a bulk line's processes give way to the others' on busy CPUs",
    )
    intake_keys: dict[str, IntakeKey] = Field(
        default_factory=dict,
        description='JSON object `{"key id": "secret"}`; a key id has no `:` and is not '
        "`schedule`, `dev`, `bench` or `replay`; a secret has at least 16 bytes. A Standard "
        'Webhooks source: `{"key id": {"kind": "standard-webhooks", "secret": "whsec_…"}}`, '
        "a key of at least 24 bytes, no two such sources with one key (see "
        "[Standard Webhooks sources](http-api.md#standard-webhooks-sources))",
        json_schema_extra={"unset": "none (the intake then needs `PIPELINE_DEV_MODE`)"},
    )
    dev_mode: bool = Field(
        default=False,
        description="without intake keys the intake starts only with this set: unsigned "
        "requests, this machine only; `pipeline up` sets it when no keys are set",
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description="the admin token (at least 16 bytes) of the actor `admin`; without it or "
        "`PIPELINE_ADMIN_TOKENS` the admin endpoints are closed, except in dev mode",
    )
    admin_tokens: dict[str, SecretStr] = Field(
        default_factory=dict,
        description='JSON object `{"name": "token"}`: named admin tokens (at least 16 bytes '
        "each, no two alike); the name is the actor in the audit log: letters, digits and "
        "`._@-`, not `dev`, and not `admin` beside `PIPELINE_ADMIN_TOKEN`",
    )
    max_body_bytes: int = Field(
        default=DEFAULT_MAX_BODY_BYTES,
        ge=1024,
        description="larger bodies get 413, on every endpoint",
    )
    journal_timeout_seconds: float = Field(
        default=5,
        gt=0,
        description="a request waits this long for the journal to take its record; past it "
        "the write is given up and rolled back, and the answer is 503 `journal_unavailable`: "
        "nothing was kept. Only a write already committing is waited for (as long again): if "
        "that gives no outcome, the answer is 503 `journal_in_doubt` (send the same request "
        "again, with its nonce: it is stored once)",
    )
    intake_push_wait_seconds: float = Field(
        default=2.0,
        gt=0,
        description="a committed record's answer waits this long at most for its push onto "
        "the queue, which runs beside the requests; past it the answer is 202 `received`, "
        "whatever Redis does (stopped, partitioned, slow), and the sweeper pushes the record",
    )
    intake_max_concurrent_requests: int = Field(
        default=256,
        ge=1,
        description="requests in flight (their body read) per intake process; more get 503 "
        "with `Retry-After`; a `caller_runs` line's waiting ones take at most a quarter",
    )
    intake_body_timeout_seconds: float = Field(
        default=10, gt=0, description="a whole body must arrive within this (408)"
    )
    intake_keep_alive_seconds: int = Field(
        default=5, ge=1, description="an idle keep-alive connection is closed after this"
    )
    intake_max_header_bytes: int = Field(
        default=16 * 1024,
        ge=1024,
        description="larger headers (or more than 100 of them) get 431, counted while they "
        "are read",
    )
    intake_header_timeout_seconds: float = Field(
        default=10,
        gt=0,
        description="a connection whose headers have not all arrived within this (from its "
        "opening, or from its next request's first byte) gets 408 and is closed",
    )
    timestamp_window_seconds: int = Field(
        default=300,
        ge=1,
        description="a signed request's timestamp (`X-Timestamp`, `webhook-timestamp`) must "
        "be within this of the intake's clock, either way (±300 s by default); the retention "
        "settings may not be shorter than twice it, the time a signed request can be sent "
        "again",
    )
    alert_webhooks: list[WebhookSettings] = Field(
        default_factory=list,
        description='JSON list of `{"kind": "generic"|"dingtalk"|"slack", "url": ..., '
        '"secret": ...}` (see [Alerts](operating.md#alerts))',
        json_schema_extra={"unset": "none (log only)"},
    )
    alert_window_seconds: float = Field(
        default=60,
        gt=0,
        description="a point event (not an incident) sends at most one message per (event, "
        "line) per window, with the folded count; an incident resolves after its condition "
        "was quiet this long",
    )
    alert_buffer_size: int = Field(
        default=1000,
        ge=1,
        description="Alerts waiting to be sent; when full the oldest is dropped (and "
        "counted), never the caller",
    )
    backlog_after_seconds: float = Field(
        default=300,
        gt=0,
        description="`BACKLOG` when a line's oldest unfinished record is older",
    )
    monitor_interval_seconds: float = Field(
        default=15, gt=0, description="how often beat runs the queue monitor"
    )
    # The heartbeat key is refreshed at a third of this.
    worker_heartbeat_ttl_seconds: float = Field(
        default=15, ge=1, description="a worker that stops beating counts as gone after this"
    )
    # A stalled worker also counts as not live, and restarts its consumer.
    worker_stall_after_seconds: float = Field(
        default=30,
        gt=0,
        description="a worker that has taken nothing from its line's waiting queue this long "
        "while it had a free slot counts as stalled (`WORKER_STALLED`); checked at each "
        "heartbeat (a third of the heartbeat TTL)",
    )
    visibility_timeout_seconds: int = Field(
        default=120,
        ge=1,
        description="a killed worker's message comes back after this; an attempt's lease on "
        "its record lasts 95 % of it (see [Records](operating.md#records))",
    )
    beat_lock_ttl_seconds: int = Field(
        default=10,
        ge=1,
        description="the active beat's Redis lock (`pipeline:beat:lock`) lasts this long: a "
        "standby beat takes over within it of the holder's death (see "
        "[Schedules](operating.md#schedules))",
    )
    sweep_interval_seconds: float = Field(
        default=2.0, gt=0, description="how often beat runs the sweeper"
    )
    # A received record younger than this may still be on its way onto the queue.
    received_grace_seconds: float = Field(
        default=5.0,
        ge=0,
        description="a `received` record unchanged for this long is pushed by the sweeper",
    )
    lost_after_seconds: float = Field(
        default=10,
        gt=0,
        description="a record enqueued this long with no attempt has its message looked for, "
        "every `PIPELINE_LOST_CHECK_INTERVAL_SECONDS`; one Redis lost is pushed again, one "
        "that only waits is never pushed twice (this replaces the former "
        "`PIPELINE_STUCK_AFTER_SECONDS`, which is no longer read)",
    )
    lost_check_interval_seconds: float = Field(
        default=10,
        gt=0,
        description="how often beat looks for the messages of the records enqueued "
        "`PIPELINE_LOST_AFTER_SECONDS` with no attempt",
    )
    sweep_batch_size: int = Field(
        default=500, ge=1, description="records the sweeper claims per batch"
    )
    sweep_max_per_run: int = Field(
        default=5000, ge=1, description="records the sweeper claims per sweep"
    )
    retention_days: float = Field(
        default=30,
        ge=0,
        description="`done` records are deleted this long after they finished (`0` keeps them)",
    )
    retention_undelivered_days: float = Field(
        default=30,
        ge=0,
        description="`dead`, `rejected` and `cancelled` records are deleted this long after "
        "they became so (`0` keeps them); this and `PIPELINE_RETENTION_DAYS` are refused at "
        "start when shorter than twice `PIPELINE_TIMESTAMP_WINDOW_SECONDS` (300 s, so 600 s), "
        "the time a signed request can be sent again",
    )
    retention_interval_seconds: float = Field(
        default=3600, gt=0, description="how often beat runs retention"
    )
    retention_batch_size: int = Field(
        default=1000, ge=1, description="records retention deletes per transaction"
    )
    retention_max_run_seconds: float = Field(
        default=900,
        gt=0,
        description="a retention run stops after this long, and the next goes on where it stopped",
    )
    redis_health_check_interval_seconds: float = Field(
        default=2,
        ge=0,
        description="every Redis client (the broker's, ours, the lock's) replaces a pooled "
        "connection idle past this before using it; keep it below the idle timeout of any "
        "proxy, NAT or load balancer between the pipeline and Redis; `0` turns it off (see "
        "[Connections](operating.md#connections))",
    )
    redis_socket_timeout_seconds: float = Field(
        default=5,
        ge=0,
        description="a Redis read times out after this; above 1 s, the worker's blocking "
        "fetch; `0` turns it off",
    )
    redis_connect_timeout_seconds: float = Field(
        default=2,
        ge=0,
        description="a Redis connect times out after this; `0` turns it off",
    )
    redis_socket_keepalive: bool = Field(
        default=True, description="TCP keepalive on every Redis connection"
    )
    redis_retry_on_timeout: bool = Field(
        default=True,
        description="a Redis command that timed out is retried on a new connection",
    )
    # Off unless asked for: another application's keys would sit beside the pipeline's
    # queues, and a flush of either would take both.
    redis_shared: bool = Field(
        default=False,
        description="`pipeline up` uses a Redis database that holds another application's "
        "keys (as `--share-redis`) instead of refusing it",
    )
    worker_soft_shutdown_seconds: float = Field(
        default=10,
        ge=0,
        description="Celery's soft shutdown: a stopped worker finishes or re-queues what it "
        "holds within this; a stalled worker that still lives this long plus "
        "`PIPELINE_WORKER_STALL_AFTER_SECONDS` after it sent itself SIGQUIT ends with exit "
        "code 70 (see [Alerts](operating.md#alerts))",
    )
    flower_host: str = Field(default="127.0.0.1", description="where Flower listens: its address")
    flower_port: int = Field(
        default=5555, ge=0, le=65535, description="where Flower listens: its port"
    )
    flower_basic_auth: SecretStr | None = Field(
        default=None,
        description="`user:password` for Flower; no `,` (Flower would split it into several "
        "credentials)",
        json_schema_extra={"unset": "generated, printed once"},
    )
    otel_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://\S+$",
        description="an OTLP/HTTP collector, e.g. `http://collector:4318` (spans go to "
        "`…/v1/traces`); needs `pip install 'durable-pipeline[otel]'` (see "
        "[Tracing](operating.md#tracing))",
        json_schema_extra={"unset": "none (nothing traced)"},
    )
    log_json: bool = Field(default=False, description="JSON log lines for production")
    log_level: str = Field(
        default="INFO",
        pattern=r"^(DEBUG|INFO|WARNING|ERROR)$",
        description="the lowest level logged",
    )
    lines: dict[str, LineSettings] = Field(
        default_factory=dict,
        description=f"per line, e.g. `{ENV_PREFIX}LINES{NESTED}ORDER{NESTED}MAX_QUEUE_LENGTH=500` "
        "(see [Per line](#per-line))",
    )

    @field_validator("lines", mode="before")
    @classmethod
    def _merge_default_lines(cls, value: Any) -> dict[str, Any]:
        given = dict(value or {})
        merged: dict[str, Any] = {}
        for name in [*DEFAULT_LINES, *[n for n in given if n not in DEFAULT_LINES]]:
            if not LINE_NAME.match(name):
                raise ValueError(f"line name {name!r} must match {LINE_NAME.pattern}")
            if name in RESERVED_LINE_NAMES:
                raise ValueError(
                    f"line name {name!r} is one of the intake's own paths: "
                    f"{', '.join(sorted(RESERVED_LINE_NAMES))}"
                )
            override = given.get(name, {})
            if isinstance(override, LineSettings):
                override = override.model_dump()
            if not isinstance(override, dict):
                raise TypeError(f"line {name!r} must be a table of settings")
            defaults = dict(DEFAULT_LINES.get(name, {}))
            if any(override.get(key) is not None for key in _SINK_CHOICE):
                defaults.pop("sink", None)
            merged[name] = {**defaults, **override}
        return merged

    @field_validator("intake_keys", mode="before")
    @classmethod
    def _unambiguous_keys_and_long_secrets(cls, value: Any) -> Any:
        return parse_intake_keys(value)

    @field_validator("admin_token")
    @classmethod
    def _long_token(cls, value: SecretStr | None) -> SecretStr | None:
        check_single_token(value)
        return value

    @field_validator("admin_tokens")
    @classmethod
    def _named_tokens(
        cls, value: dict[str, SecretStr], info: ValidationInfo
    ) -> dict[str, SecretStr]:
        check_named_tokens(value, single=info.data.get("admin_token"))
        return value

    @property
    def admin_actors(self) -> dict[str, SecretStr]:
        """Every admin token, by the actor it names (the single token is `admin`)."""
        actors = dict(self.admin_tokens)
        if self.admin_token is not None:
            actors[SINGLE_TOKEN_ACTOR] = self.admin_token
        return actors

    @field_validator("flower_basic_auth")
    @classmethod
    def _user_and_password(cls, value: SecretStr | None) -> SecretStr | None:
        check_flower_credential(value)
        return value

    @field_validator("intake_lines", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str) and not value.lstrip().startswith("["):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _intake_lines_known(self) -> Settings:
        unknown = sorted(set(self.intake_lines or ()) - set(self.lines))
        if unknown:
            raise ValueError(
                f"PIPELINE_INTAKE_LINES names no such line: {', '.join(unknown)} "
                f"(the lines are: {', '.join(self.lines)})"
            )
        if self.intake_lines == []:
            raise ValueError("PIPELINE_INTAKE_LINES is empty: name a line, or leave it unset")
        return self

    @field_validator("retention_days", "retention_undelivered_days")
    @classmethod
    def _retention_past_replays(cls, value: float, info: ValidationInfo) -> float:
        # A record's dedup key, (key id, nonce), goes with it. A request is accepted while
        # its timestamp is within the window either way of the intake's clock, so the same
        # request can come again until twice the window after it was accepted: a record
        # deleted sooner lets that replay in as a new record.
        window_s = info.data.get("timestamp_window_seconds")
        if window_s is not None and 0 < value * SECONDS_PER_DAY < 2 * window_s:
            raise ValueError(
                f"must be 0 (keep them) or at least twice PIPELINE_TIMESTAMP_WINDOW_SECONDS, "
                f"{2 * window_s} s ({2 * window_s / SECONDS_PER_DAY:.6g} days): a record "
                "deleted sooner forgets the nonce of a request that can still be sent again"
            )
        return value

    @model_validator(mode="after")
    def _deliveries_within_their_lease(self) -> Settings:
        # A delivery that outlives its lease may meet a second attempt of its record (the
        # lease lapsed, the record was taken again): its longest run must end before the
        # lease does.
        lease_s = self.lease_seconds
        for name, line in self.lines.items():
            if line.resolved_sink.kind is not SinkKind.HTTP:
                continue  # its timeout bounds no request
            longest_s = longest_delivery_s(line, lease_s=lease_s)
            if longest_s >= lease_s:
                raise ValueError(
                    f"PIPELINE_LINES__{name.upper()}__DELIVERY_TIMEOUT_S "
                    f"({line.delivery_timeout_s:g} s) lets a delivery outlive its lease: with "
                    f"its wait for room ({limit_wait_s(lease_s):g} s) it may take "
                    f"{longest_s:g} s, and the lease is {lease_s:g} s (95 % of "
                    f"PIPELINE_VISIBILITY_TIMEOUT_SECONDS); raise that, or lower this"
                )
        return self

    @model_validator(mode="after")
    def _brpop_below_socket_timeout(self) -> Settings:
        # The worker's blocking fetch must return before the socket times out.
        if 0 < self.redis_socket_timeout_seconds <= BRPOP_TIMEOUT_S:
            raise ValueError(
                f"PIPELINE_REDIS_SOCKET_TIMEOUT_SECONDS must be above {BRPOP_TIMEOUT_S} s, "
                "the worker's blocking fetch"
            )
        return self

    @property
    def lease_seconds(self) -> float:
        """How long an attempt's lease on its record lasts: past the hard time limit of a
        task (90 % of the visibility timeout, `app.celery_app`), and short of the
        visibility timeout, so that a killed worker's message, back after it, finds the
        lease expired and takes it over."""
        return self.visibility_timeout_seconds * 0.95

    @property
    def in_dev_mode(self) -> bool:
        """Dev mode asked for and no intake keys: unsigned requests, from this machine
        only, admin endpoints open unless an admin token is set. With keys, requests are
        signed whatever `dev_mode` says."""
        return self.dev_mode and not self.intake_keys

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get(f"{ENV_PREFIX}CONFIG")
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file)))
        return tuple(sources)


def redis_options(settings: Settings) -> dict[str, Any]:
    """Redis client options from the settings (0 turns a timeout or the health check off)."""
    return {
        "health_check_interval": settings.redis_health_check_interval_seconds,
        "socket_keepalive": settings.redis_socket_keepalive,
        "socket_connect_timeout": settings.redis_connect_timeout_seconds or None,
        "socket_timeout": settings.redis_socket_timeout_seconds or None,
        "retry_on_timeout": settings.redis_retry_on_timeout,
    }


def _variable_name(location: tuple[int | str, ...]) -> str:
    return ENV_PREFIX + NESTED.join(str(part).upper() for part in location)


def top_level_variables() -> list[str]:
    """The variables of the settings' own fields (a line's settings are nested under
    `PIPELINE_LINES__<LINE>__`)."""
    return [f"{ENV_PREFIX}{field.upper()}" for field in Settings.model_fields]


def _line_variables(line: str) -> list[str]:
    stem = f"{ENV_PREFIX}LINES{NESTED}{line.upper()}{NESTED}"
    return [stem + field.upper() for field in LineSettings.model_fields]


def closest_known(name: str) -> str | None:
    """The known variable most like `name`, if any is alike enough. Compared without the
    part they share: the prefix, and a line's `LINES__<LINE>__` (or `MAX_QUEUE_LENGTH`
    would look like any other line setting of that line)."""
    upper = name.upper()
    parts = upper.split(NESTED)
    if len(parts) == 3 and parts[0] == f"{ENV_PREFIX}LINES":
        stem = f"{parts[0]}{NESTED}{parts[1]}{NESTED}"
        fields = [field.upper() for field in LineSettings.model_fields]
        return _closest(parts[2], {field: stem + field for field in fields})
    named = parts[1].lower() if len(parts) == 3 else ""
    lines = [*DEFAULT_LINES, *([named] if LINE_NAME.match(named) else [])]
    candidates = top_level_variables() + [
        v for line in dict.fromkeys(lines) for v in _line_variables(line)
    ]
    return _closest(
        upper.removeprefix(ENV_PREFIX), {c.removeprefix(ENV_PREFIX): c for c in candidates}
    )


def _closest(word: str, candidates: Mapping[str, str]) -> str | None:
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=CLOSE_ENOUGH)
    return candidates[found[0]] if found else None


def load_settings(**overrides: Any) -> Settings:
    """Read the settings from the environment (and `PIPELINE_CONFIG`).

    Raises `ConfigError` with one line naming the first bad variable."""
    config_file = os.environ.get(f"{ENV_PREFIX}CONFIG")
    if config_file and not Path(config_file).is_file():
        raise ConfigError(f"{ENV_PREFIX}CONFIG: no such file: {config_file}")
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = _variable_name(first["loc"]) if first["loc"] else "settings"
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            closest = closest_known(name)
            message = "is not a setting" + (f"; did you mean {closest}?" if closest else "")
        raise ConfigError(f"{name}: {message}") from None
    except SettingsError as exc:
        match = re.search(r'field "(\w+)"', str(exc))
        name = _variable_name((match.group(1),)) if match else "settings"
        raise ConfigError(f"{name}: could not be parsed ({exc.__cause__ or exc})") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{ENV_PREFIX}CONFIG: {exc}") from None
