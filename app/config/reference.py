"""The configuration reference, docs/configuration.md, generated from the settings model:
every `PIPELINE_` variable of `Settings` and of a line's `LineSettings`, with its type and
default read from the model and its meaning from, in turn, the field's `description`, the
text of `MEANINGS` below, or the comment above the field in its module.

`reference()` returns the Markdown; `python -m app.config.reference` prints it, so the page
is regenerated with `python -m app.config.reference > docs/configuration.md`. A unit test
checks that the page is what this prints."""

from __future__ import annotations

import ast
import enum
import inspect
import re
import sys
import types
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from app.config.line_settings import LineSettings
from app.config.settings import DEFAULT_LINES, ENV_PREFIX, NESTED, Settings

# The command that rewrites the page; the unit test's failure names it.
REGENERATE = "python -m app.config.reference > docs/configuration.md"
# The field of `Settings` that holds the lines: it has a table of its own.
LINES_FIELD = "lines"
# A line setting's variable, up to the setting's own name.
LINE_VARIABLE = f"{ENV_PREFIX}LINES{NESTED}<LINE>{NESTED}"
# The pattern every URL field of the settings takes.
URL_PATTERN = r"^https?://\S+$"
# A pattern of a few alternatives, `^(A|B|C)$`: shown as the list of them.
ALTERNATIVES = re.compile(r"^\^\((?P<words>[\w|]+)\)\$$")


@dataclass(frozen=True, kw_only=True)
class Meaning:
    """What a setting means, for a field that has no `description`: `text`, and `unset`,
    what its default says when the field has none (None, or an empty table or list)."""

    text: str
    unset: str | None = None


# The meaning of each setting, as the README told it before this page existed. A field
# missing here (and without a description) takes the comment above it in its module.
MEANINGS: dict[str, Meaning] = {
    "redis_url": Meaning(
        text="broker; password and db in the URL; `sentinel://h1:26379,h2:26379/0?master=NAME` "
        "for Redis behind Sentinel (see [Scaling](operating.md#scaling))"
    ),
    "database_url": Meaning(
        text="the journal; `postgresql+psycopg://…` in production; a SQLite journal must be a "
        "file that can use WAL (an in-memory `sqlite://` is refused at start)"
    ),
    "intake_host": Meaning(text="where the intake listens: its address"),
    "intake_port": Meaning(text="where the intake listens: its port"),
    "intake_workers": Meaning(text="intake server processes"),
    "intake_lines": Meaning(
        text="comma-separated lines whose records this intake takes; another line's `POST` is "
        '421 `line_not_served_here` (see "A flood on one line" in '
        "[Scaling](operating.md#scaling))",
        unset="all",
    ),
    "nice": Meaning(
        text="an intake, worker or beat started with it lowers its CPU priority to this (0 to "
        "19, as `nice`): a bulk line's processes give way to the others' on busy CPUs"
    ),
    "intake_keys": Meaning(
        text='JSON object `{"key id": "secret"}`; a key id has no `:` and is not `schedule`, '
        "`dev`, `bench` or `replay`; a secret has at least 16 bytes. A Standard Webhooks "
        'source: `{"key id": {"kind": "standard-webhooks", "secret": "whsec_…"}}`, a key of '
        "at least 24 bytes, no two such sources with one key (see "
        "[Standard Webhooks sources](http-api.md#standard-webhooks-sources))",
        unset="none (the intake then needs `PIPELINE_DEV_MODE`)",
    ),
    "dev_mode": Meaning(
        text="without intake keys the intake starts only with this set: unsigned requests, "
        "this machine only; `pipeline up` sets it when no keys are set"
    ),
    "admin_token": Meaning(
        text="the admin token (at least 16 bytes) of the actor `admin`; without it or "
        "`PIPELINE_ADMIN_TOKENS` the admin endpoints are closed, except in dev mode"
    ),
    "admin_tokens": Meaning(
        text='JSON object `{"name": "token"}`: named admin tokens (at least 16 bytes each, no '
        "two alike); the name is the actor in the audit log: letters, digits and `._@-`, not "
        "`dev`, and not `admin` beside `PIPELINE_ADMIN_TOKEN`"
    ),
    "max_body_bytes": Meaning(text="larger bodies get 413, on every endpoint"),
    "journal_timeout_seconds": Meaning(
        text="a request waits this long for the journal to take its record; past it the "
        "write is given up and rolled back, and the answer is 503 `journal_unavailable`: "
        "nothing was kept. Only a write already committing is waited for (as long again): if "
        "that gives no outcome, the answer is 503 `journal_in_doubt` (send the same request "
        "again, with its nonce: it is stored once)"
    ),
    "intake_push_wait_seconds": Meaning(
        text="a committed record's answer waits this long at most for its push onto the "
        "queue, which runs beside the requests; past it the answer is 202 `received`, "
        "whatever Redis does (stopped, partitioned, slow), and the sweeper pushes the record"
    ),
    "intake_max_concurrent_requests": Meaning(
        text="requests in flight (their body read) per intake process; more get 503 with "
        "`Retry-After`; a `caller_runs` line's waiting ones take at most a quarter"
    ),
    "intake_body_timeout_seconds": Meaning(text="a whole body must arrive within this (408)"),
    "intake_keep_alive_seconds": Meaning(text="an idle keep-alive connection is closed after this"),
    "intake_max_header_bytes": Meaning(
        text="larger headers (or more than 100 of them) get 431, counted while they are read"
    ),
    "intake_header_timeout_seconds": Meaning(
        text="a connection whose headers have not all arrived within this (from its opening, "
        "or from its next request's first byte) gets 408 and is closed"
    ),
    "timestamp_window_seconds": Meaning(
        text="a signed request's timestamp (`X-Timestamp`, `webhook-timestamp`) must be "
        "within this of the intake's clock, either way (±300 s by default); the retention "
        "settings may not be shorter than twice it, the time a signed request can be sent "
        "again"
    ),
    "alert_webhooks": Meaning(
        text='JSON list of `{"kind": "generic"|"dingtalk"|"slack", "url": ..., "secret": ...}` '
        "(see [Alerts](operating.md#alerts))",
        unset="none (log only)",
    ),
    "alert_window_seconds": Meaning(
        text="a point event (not an incident) sends at most one message per (event, line) "
        "per window, with the folded count; an incident resolves after its condition was "
        "quiet this long"
    ),
    "backlog_after_seconds": Meaning(
        text="`BACKLOG` when a line's oldest unfinished record is older"
    ),
    "monitor_interval_seconds": Meaning(text="how often beat runs the queue monitor"),
    "worker_heartbeat_ttl_seconds": Meaning(
        text="a worker that stops beating counts as gone after this"
    ),
    "worker_stall_after_seconds": Meaning(
        text="a worker that has taken nothing from its line's waiting queue this long while "
        "it had a free slot counts as stalled (`WORKER_STALLED`); checked at each heartbeat "
        "(a third of the heartbeat TTL)"
    ),
    "visibility_timeout_seconds": Meaning(
        text="a killed worker's message comes back after this; an attempt's lease on its "
        "record lasts 95 % of it (see [Records](operating.md#records))"
    ),
    "beat_lock_ttl_seconds": Meaning(
        text="the active beat's Redis lock (`pipeline:beat:lock`) lasts this long: a standby "
        "beat takes over within it of the holder's death (see "
        "[Schedules](operating.md#schedules))"
    ),
    "sweep_interval_seconds": Meaning(text="how often beat runs the sweeper"),
    "received_grace_seconds": Meaning(
        text="a `received` record unchanged for this long is pushed by the sweeper"
    ),
    "lost_after_seconds": Meaning(
        text="a record enqueued this long with no attempt has its message looked for, every "
        "`PIPELINE_LOST_CHECK_INTERVAL_SECONDS`; one Redis lost is pushed again, one that "
        "only waits is never pushed twice (this replaces the former "
        "`PIPELINE_STUCK_AFTER_SECONDS`, which is no longer read)"
    ),
    "lost_check_interval_seconds": Meaning(
        text="how often beat looks for the messages of the records enqueued "
        "`PIPELINE_LOST_AFTER_SECONDS` with no attempt"
    ),
    "sweep_batch_size": Meaning(text="records the sweeper claims per batch"),
    "sweep_max_per_run": Meaning(text="records the sweeper claims per sweep"),
    "retention_days": Meaning(
        text="`done` records are deleted this long after they finished (`0` keeps them)"
    ),
    "retention_undelivered_days": Meaning(
        text="`dead`, `rejected` and `cancelled` records are deleted this long after they "
        "became so (`0` keeps them); this and `PIPELINE_RETENTION_DAYS` are refused at start "
        "when shorter than twice `PIPELINE_TIMESTAMP_WINDOW_SECONDS` (300 s, so 600 s), the "
        "time a signed request can be sent again"
    ),
    "retention_interval_seconds": Meaning(text="how often beat runs retention"),
    "retention_batch_size": Meaning(text="records retention deletes per transaction"),
    "retention_max_run_seconds": Meaning(
        text="a retention run stops after this long, and the next goes on where it stopped"
    ),
    "redis_health_check_interval_seconds": Meaning(
        text="every Redis client (the broker's, ours, the lock's) replaces a pooled "
        "connection idle past this before using it; keep it below the idle timeout of any "
        "proxy, NAT or load balancer between the pipeline and Redis; `0` turns it off (see "
        "[Connections](operating.md#connections))"
    ),
    "redis_socket_timeout_seconds": Meaning(
        text="a Redis read times out after this; above 1 s, the worker's blocking fetch; `0` "
        "turns it off"
    ),
    "redis_connect_timeout_seconds": Meaning(
        text="a Redis connect times out after this; `0` turns it off"
    ),
    "redis_socket_keepalive": Meaning(text="TCP keepalive on every Redis connection"),
    "redis_retry_on_timeout": Meaning(
        text="a Redis command that timed out is retried on a new connection"
    ),
    "redis_shared": Meaning(
        text="`pipeline up` uses a Redis database that holds another application's keys (as "
        "`--share-redis`) instead of refusing it"
    ),
    "worker_soft_shutdown_seconds": Meaning(
        text="Celery's soft shutdown: a stopped worker finishes or re-queues what it holds "
        "within this; a stalled worker that still lives this long plus "
        "`PIPELINE_WORKER_STALL_AFTER_SECONDS` after it sent itself SIGQUIT ends with exit "
        "code 70 (see [Alerts](operating.md#alerts))"
    ),
    "flower_host": Meaning(text="where Flower listens: its address"),
    "flower_port": Meaning(text="where Flower listens: its port"),
    "flower_basic_auth": Meaning(
        text="`user:password` for Flower; no `,` (Flower would split it into several credentials)",
        unset="generated, printed once",
    ),
    "otel_endpoint": Meaning(
        text="an OTLP/HTTP collector, e.g. `http://collector:4318` (spans go to "
        "`…/v1/traces`); needs `pip install 'durable-pipeline[otel]'` (see "
        "[Tracing](operating.md#tracing))",
        unset="none (nothing traced)",
    ),
    "log_json": Meaning(text="JSON log lines for production"),
    "log_level": Meaning(text="the lowest level logged"),
    LINES_FIELD: Meaning(
        text=f"per line, e.g. `{ENV_PREFIX}LINES{NESTED}ORDER{NESTED}MAX_QUEUE_LENGTH=500` "
        "(see [Per line](#per-line))"
    ),
    # A line's settings.
    "max_queue_length": Meaning(
        text="records in the line's Redis queue (named after the line), waiting or held by a "
        "worker until it acks, however many messages carry them; never exceeded"
    ),
    "batch_size": Meaning(
        text="records a queue message may carry (see [Batches](operating.md#batches))",
        unset="`16` with the built-in table sink, `32` with the HTTP sink "
        "(`DELIVERIES_IN_FLIGHT` if fewer), else `1`",
    ),
    "overflow": Meaning(
        text="when full: `defer` (journal keeps it, the sweeper drains it), `caller_runs`, "
        "`reject` (429) (see [Overload](operating.md#overload))"
    ),
    "intake_rate": Meaning(
        text="requests/s each intake process admits for the line; over it a request waits "
        "its turn (see [Overload](operating.md#overload))"
    ),
    "concurrency": Meaning(
        text="worker pool size (prefork processes); an HTTP-sink line's worker is one process "
        "that keeps `DELIVERIES_IN_FLIGHT` deliveries in flight instead (see "
        "[The delivery path](operating.md#the-delivery-path))"
    ),
    "max_attempts": Meaning(text="tries in all; then the record is `dead`"),
    "backoff_initial_s": Meaning(
        text="full-jitter exponential backoff between attempts: its first step"
    ),
    "backoff_max_s": Meaning(
        text="full-jitter exponential backoff between attempts: its longest step"
    ),
    "downstream_url": Meaning(
        text="set: POST `{id, line, business_no, payload}` there with `Idempotency-Key: <id>` "
        "and `X-Attempt: <attempt number>`; an answer in `DELIVERED_STATUSES` is delivered, "
        "any other (or none in time) is a failed attempt"
    ),
    "delivered_statuses": Meaning(
        text="comma-separated `2xx` and/or exact codes of 200-499, e.g. `2xx,409`. 409 is not "
        "delivered by default: some downstreams answer it for a key whose first request "
        "they are still processing, which may yet fail; add it only where 409 means "
        '"already have it"'
    ),
    "signing_secret": Meaning(
        text="`whsec_` and the base64 of a key of at least 24 bytes: the HTTP sink signs each "
        "delivery as Standard Webhooks do, over the exact bytes sent: `webhook-id` (the "
        "record id, as `Idempotency-Key`), `webhook-timestamp` (the attempt's time) and "
        "`webhook-signature: v1,<base64>`; only on a line with the HTTP sink; never logged"
    ),
    "delivery_timeout_s": Meaning(
        text="a delivery's one deadline, from connect to the answer's last byte (for a "
        "handler, to its return): past it the attempt fails, however the downstream "
        "trickles; settings that would let a delivery outlive its lease are refused at start"
    ),
    "deliveries_in_flight": Meaning(
        text="HTTP sink: deliveries one worker process keeps in flight, on one event loop "
        "(waiting on the downstream costs no thread)"
    ),
    "delivery_rate": Meaning(
        text="HTTP sink: deliveries per second to the downstream, across every worker on "
        "every host (a token bucket in Redis)"
    ),
    "delivery_concurrency": Meaning(
        text="HTTP sink: deliveries in flight to the downstream, across every worker on every host"
    ),
    "circuit_window_s": Meaning(
        text="HTTP sink: when at least `CIRCUIT_MIN_ATTEMPTS` deliveries ended in the last "
        "`CIRCUIT_WINDOW_S` seconds and most failed, the line's circuit opens: one probe "
        "every `CIRCUIT_PROBE_INTERVAL_S`, no attempt spent meanwhile"
    ),
    "circuit_min_attempts": Meaning(
        text="HTTP sink: the deliveries that must have ended within `CIRCUIT_WINDOW_S` before "
        "the circuit may open"
    ),
    "circuit_probe_interval_s": Meaning(
        text="HTTP sink: while the circuit is open, one probe goes every this many seconds"
    ),
    "check_url": Meaning(
        text="e.g. `http://host/records/{id}`: replay asks it whether downstream has a record "
        "(200 yes, 404 no), by the record's id (the `Idempotency-Key` the HTTP sink sends); "
        "it must hold `{id}`, and may hold `{business_no}` as well"
    ),
    "handler": Meaning(text="dotted path of a callable `(record) -> None`, idempotent"),
    "sink": Meaning(
        text="where the line's records go: `http` (POST to `DOWNSTREAM_URL`), `handler` (call "
        "`HANDLER`), or `table:<name>` (upsert into a table of the journal's database: "
        "`orders`, `refunds`, `order_status` or `sink_rows`)",
        unset="see below",
    ),
    "payload_schema": Meaning(text="dotted path of a pydantic model the body must match"),
}

# The page's hand-written prose around its two generated tables: what the README said of
# the settings as a whole before this page existed.
HEAD = f"""\
# Configuration

<!-- Generated by `{REGENERATE}` from the settings model
(app/config/settings.py, app/config/line_settings.py): edit those, or the text in
app/config/reference.py, then regenerate. A unit test checks this page is up to date. -->

Every process of the pipeline reads the same settings: environment variables (or a TOML
file named by `PIPELINE_CONFIG`, with the same names in lower case, without the prefix, and
`[lines.order]` tables). A bad value stops the process at start with one line naming the
variable.

So does a `PIPELINE_DATABASE_URL` that cannot work: not a URL, a database other than
SQLite or PostgreSQL, a driver that is unknown, not installed or asynchronous, or an
in-memory SQLite (`pipeline: configuration error: PIPELINE_DATABASE_URL: …`, exit 2, from
every command; the URL itself is never printed). A `PIPELINE_` variable that is no setting
is ignored, and the command warns of it once at start, with the closest name
(`pipeline: warning: PIPELINE_INTAKE_KEY is not a setting and is ignored; did you mean
PIPELINE_INTAKE_KEYS?`); a misspelt line setting (`PIPELINE_LINES__ORDER__MAX_QUEUE_LENGHT`)
stops the process, naming the closest.

## Settings

"""

LINES_HEAD = f"""
## Per line

Each line's settings are `{LINE_VARIABLE}<SETTING>` (in the TOML file, `<setting>` in a
`[lines.<line>]` table). `order`, `refund` and `status` ship; naming a new line in a
variable adds it. A line's name is lower case (letters, digits and `_`, at most 32
characters) and is not one of the intake's own paths under `/v1/`.

"""

TAIL = """
`SINK` unset: a line with a `HANDLER` calls it, else a line with a `DOWNSTREAM_URL` posts
there, else the table sink writes the line's table. The shipped lines' tables are
`orders` and `refunds` (keyed by `business_no`) and `order_status` (the newest `status`
per `business_no`, by `occurred_at`); any other line's is `sink_rows` (keyed by line and
`business_no`). A sink that lacks what it needs (`http` without `DOWNSTREAM_URL`,
`handler` without `HANDLER`, an unknown table, a `HANDLER` beside another sink) stops the
process at start, naming the line's variable.
"""


def reference() -> str:
    """The configuration reference, as Markdown. Raises `KeyError` naming a field that
    has neither a description, nor a text in `MEANINGS`, nor a comment above it."""
    top = [
        _row(f"{ENV_PREFIX}{name.upper()}", name, field, Settings)
        for name, field in Settings.model_fields.items()
    ]
    per_line = [
        _row(f"{LINE_VARIABLE}{name.upper()}", name, field, LineSettings)
        for name, field in LineSettings.model_fields.items()
    ]
    return HEAD + _table(top) + LINES_HEAD + _table(per_line) + TAIL


def _table(rows: list[str]) -> str:
    head = "| variable | type | default | meaning |\n| --- | --- | --- | --- |\n"
    return head + "".join(f"{row}\n" for row in rows)


def _row(variable: str, name: str, field: FieldInfo, model: type[BaseModel]) -> str:
    meaning = _meaning(name, field, model)
    cells = [f"`{variable}`", _type_text(field), _default_text(name, field, meaning), meaning.text]
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def _cell(text: str) -> str:
    """`text` in a table's cell: a `|` of its own would end the cell."""
    return text.replace("|", "\\|")


def _meaning(name: str, field: FieldInfo, model: type[BaseModel]) -> Meaning:
    known = MEANINGS.get(name)
    if field.description:
        return Meaning(text=field.description, unset=known.unset if known else None)
    if known is not None:
        return known
    comment = field_comments(model).get(name)
    if comment:
        return Meaning(text=comment.removesuffix("."))  # a cell, like the others
    raise KeyError(
        f"{model.__name__}.{name}: no description, no text in MEANINGS "
        "(app/config/reference.py) and no comment above it"
    )


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """The comment right above each field of `model`'s class body, by field name."""
    source = inspect.getsource(sys.modules[model.__module__])
    lines = source.splitlines()
    (cls,) = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef) and node.name == model.__name__
    ]
    comments: dict[str, str] = {}
    for statement in cls.body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        above: list[str] = []
        index = statement.lineno - 2  # the line above, counted from 0
        while index >= 0 and lines[index].strip().startswith("#"):
            above.insert(0, lines[index].strip().removeprefix("#").strip())
            index -= 1
        if above:
            comments[statement.target.id] = " ".join(above)
    return comments


def _type_text(field: FieldInfo) -> str:
    annotation = field.annotation
    args = get_args(annotation)
    if get_origin(annotation) in (Union, types.UnionType) and type(None) in args:
        (annotation,) = [arg for arg in args if arg is not type(None)]
    return ", ".join([_kind(annotation), *_constraints(field)])


def _kind(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is dict:
        return "JSON object"
    if origin is list:
        return "comma-separated list" if get_args(annotation) == (str,) else "JSON list"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(f"`{member.value}`" for member in annotation)
    names = {str: "text", int: "integer", float: "number", bool: "boolean", SecretStr: "secret"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _constraints(field: FieldInfo) -> list[str]:
    bounds: dict[str, Any] = {}
    said: list[str] = []
    for item in field.metadata:
        if isinstance(item, annotated_types.Ge):
            bounds["≥"] = item.ge
        elif isinstance(item, annotated_types.Gt):
            bounds[">"] = item.gt
        elif isinstance(item, annotated_types.Le):
            bounds["≤"] = item.le
        pattern = getattr(item, "pattern", None)
        if pattern == URL_PATTERN:
            said.append("an http(s) URL")
        elif pattern and (alternatives := ALTERNATIVES.match(pattern)):
            said.append("one of " + ", ".join(f"`{w}`" for w in alternatives["words"].split("|")))
    if "≥" in bounds and "≤" in bounds:
        said.insert(0, f"{_number(bounds['≥'])} to {_number(bounds['≤'])}")
    else:
        said[:0] = [f"{sign} {_number(value)}" for sign, value in bounds.items()]
    return said


def _default_text(name: str, field: FieldInfo, meaning: Meaning) -> str:
    if name == LINES_FIELD:
        return ", ".join(f"`{line}`" for line in DEFAULT_LINES)
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    else:
        value = None if field.default is PydanticUndefined else field.default
    if value is None or value in ({}, []):
        return meaning.unset or "none"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int | float):
        return f"`{_number(value)}`"
    return f"`{value}`"


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def main() -> None:
    sys.stdout.write(reference())


if __name__ == "__main__":
    main()
