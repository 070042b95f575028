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

    redis_url: Annotated[str, AfterValidator(check_redis_url)] = "redis://127.0.0.1:6379/0"
    database_url: Annotated[str, AfterValidator(check_database_url)] = "sqlite:///./pipeline.db"
    intake_host: str = "127.0.0.1"
    intake_port: int = Field(default=8000, ge=0, le=65535)
    intake_workers: int = Field(default=1, ge=1, le=64)
    # The lines whose records this intake takes (comma-separated); another line's POST is
    # answered 421 `line_not_served_here`. Unset: every line. An intake per group of lines
    # keeps a flood of one line off the CPU of another's.
    intake_lines: list[str] | None = None
    # Every pipeline process started with this (intake, worker, beat) lowers its CPU
    # priority to it (0-19, as `nice`): a bulk line's intake and worker give way to the
    # others' when the CPUs are busy.
    nice: int = Field(default=0, ge=0, le=19)
    # Key id -> a secret (the pipeline's own scheme) or {"kind", "secret"} (`IntakeKey`).
    intake_keys: dict[str, IntakeKey] = Field(default_factory=dict)
    # Without intake keys the intake refuses to start unless this is set: then it takes
    # unsigned requests from this machine only (`in_dev_mode`).
    dev_mode: bool = False
    # The admin token of the actor `admin`; more, named ones (name -> token) beside it.
    admin_token: SecretStr | None = None
    admin_tokens: dict[str, SecretStr] = Field(default_factory=dict)
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024)
    # A request waits this long at most for the journal to take its record, then gets 503
    # (nothing of it is kept: its write is rolled back).
    journal_timeout_seconds: float = Field(default=5, gt=0)
    # A committed record's answer waits this long at most for its push onto the queue; past
    # it the answer is 202 `received`, whatever Redis does, and the sweeper pushes it.
    intake_push_wait_seconds: float = Field(default=2.0, gt=0)
    # Resource limits of each intake process: requests in flight beyond this get 503; a
    # body must arrive within the timeout (408); an idle keep-alive connection is closed.
    intake_max_concurrent_requests: int = Field(default=256, ge=1)
    intake_body_timeout_seconds: float = Field(default=10, gt=0)
    intake_keep_alive_seconds: int = Field(default=5, ge=1)
    intake_max_header_bytes: int = Field(default=16 * 1024, ge=1024)
    # A connection whose request line and headers have not all arrived this long after it
    # opened (on a kept-alive connection: after the next request's first byte) is closed.
    intake_header_timeout_seconds: float = Field(default=10, gt=0)
    timestamp_window_seconds: int = Field(default=300, ge=1)
    alert_webhooks: list[WebhookSettings] = Field(default_factory=list)
    alert_window_seconds: float = Field(default=60, gt=0)
    # Alerts waiting to be sent; when full the oldest is dropped (and counted), never the caller.
    alert_buffer_size: int = Field(default=1000, ge=1)
    # A line whose oldest unfinished record is older than this raises BACKLOG.
    backlog_after_seconds: float = Field(default=300, gt=0)
    monitor_interval_seconds: float = Field(default=15, gt=0)
    # A worker's heartbeat key lives this long; it is refreshed at a third of it.
    worker_heartbeat_ttl_seconds: float = Field(default=15, ge=1)
    # A worker with a free pool slot whose line's queue has had work this long, and whose
    # consumer took none of it, is stalled: it raises WORKER_STALLED, counts as not live and
    # restarts its consumer. Checked at each heartbeat (a third of the TTL).
    worker_stall_after_seconds: float = Field(default=30, gt=0)
    visibility_timeout_seconds: int = Field(default=120, ge=1)
    beat_lock_ttl_seconds: int = Field(default=10, ge=1)
    sweep_interval_seconds: float = Field(default=2.0, gt=0)
    # A received record younger than this may still be on its way onto the queue.
    received_grace_seconds: float = Field(default=5.0, ge=0)
    # A record enqueued this long with no attempt since is checked for its message, every
    # `lost_check_interval_seconds`; one whose message Redis lost is pushed again (one whose
    # message waits, however long its queue, is not).
    lost_after_seconds: float = Field(default=10, gt=0)
    lost_check_interval_seconds: float = Field(default=10, gt=0)
    sweep_batch_size: int = Field(default=500, ge=1)
    sweep_max_per_run: int = Field(default=5000, ge=1)
    # `done` records are deleted this many days after they finished, and `dead`, `rejected`
    # and `cancelled` ones this many days after they became so (0 keeps them forever).
    retention_days: float = Field(default=30, ge=0)
    retention_undelivered_days: float = Field(default=30, ge=0)
    retention_interval_seconds: float = Field(default=3600, gt=0)
    retention_batch_size: int = Field(default=1000, ge=1)
    # A retention run stops after this long; the next run goes on where it stopped.
    retention_max_run_seconds: float = Field(default=900, gt=0)
    # Connection rules of every Redis client; 0 turns one off.
    redis_health_check_interval_seconds: float = Field(default=2, ge=0)
    redis_socket_timeout_seconds: float = Field(default=5, ge=0)
    redis_connect_timeout_seconds: float = Field(default=2, ge=0)
    redis_socket_keepalive: bool = True
    redis_retry_on_timeout: bool = True
    # `pipeline up` refuses a Redis database that holds keys of another application (they
    # would sit beside the pipeline's queues, and a flush of either would take both) unless
    # this is set (or `pipeline up --share-redis`).
    redis_shared: bool = False
    # Celery's soft shutdown: a stopped worker finishes or re-queues what it holds.
    worker_soft_shutdown_seconds: float = Field(default=10, ge=0)
    flower_host: str = "127.0.0.1"
    flower_port: int = Field(default=5555, ge=0, le=65535)
    # `user:password`; `pipeline up` and `pipeline flower` generate one when it is not set.
    flower_basic_auth: SecretStr | None = None
    # An OTLP/HTTP collector (e.g. http://collector:4318): each process exports its spans
    # there (app.telemetry.tracing; needs the `otel` extra). Unset: nothing is traced.
    otel_endpoint: str | None = Field(default=None, pattern=r"^https?://\S+$")
    log_json: bool = False
    log_level: str = Field(default="INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")
    lines: dict[str, LineSettings] = Field(default_factory=dict)

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
