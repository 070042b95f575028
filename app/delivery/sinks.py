"""The built-in sinks. Both are idempotent.

- Table sink: upserts by business number into the line's table (`sink = table:<name>`) in
  the journal's database, in the same transaction that marks the record done;
  `sink_rows` is keyed by (line, business number), and `order_status` keeps the newest
  `occurred_at`.
- HTTP sink: POSTs `{id, line, business_no, payload}` with `Idempotency-Key: <id>` and
  `X-Attempt: <attempt number>`, signed as Standard Webhooks do when the line has a
  `signing_secret`;
  an answer among the line's `delivered_statuses` (2xx by default) is delivered, anything
  else (or no answer within the line's `delivery_timeout_s`) is a failed attempt.

A delivery has one deadline: `delivery_timeout_s` bounds its request from connect to last
byte, however the downstream trickles its answer. httpx's timeouts are per phase and per
read (a byte every few seconds would keep a request open for ever), so the HTTP sink's
transport reads and writes through a network backend that cuts every step short at the
deadline of the request its thread is making (`deadline`)."""

from __future__ import annotations

import contextlib
import email.utils
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import httpcore
import httpx
from pydantic import SecretStr
from sqlalchemy import Connection, Table, bindparam, select
from sqlalchemy.dialects import postgresql, sqlite

from app import standard_webhooks
from app.clock import as_utc
from app.errors import DeliveryFailed
from app.journal.models import Record, order_status, orders, refunds, sink_rows
from app.journal.store import among
from app.sink_settings import DeliveredStatuses

# The table that keeps the newest status per order (not a payload per business number).
ORDER_STATUS_TABLE = order_status.name
# The table sink's tables by the name a line's `sink` gives (`table:<name>`).
TABLES: dict[str, Table] = {
    table.name: table for table in (orders, refunds, order_status, sink_rows)
}
# The shared client's timeout, for what names none of its own (replay's check URL); the
# HTTP sink's POST takes its line's `delivery_timeout_s`.
HTTP_TIMEOUT_S = 10.0
# The longest wait a downstream's `Retry-After` is honoured for: the record's next attempt
# is due no later than this, whatever a downstream asks (a date years ahead included).
MAX_RETRY_AFTER_S = 3600.0


# The HTTP sink's client's pool: kept-alive connections for the most deliveries a line
# may keep in flight in one process (`delivery_threads`).
HTTP_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=256)


# Built once per (dialect, table): the worker runs them for every record.
_UPSERTS: dict[tuple[str, str], Any] = {}


def _upsert(conn: Connection, table: Table) -> Any:
    """The table sink's upsert into `table`, with a bind parameter per column."""
    key = (conn.dialect.name, table.name)
    if key not in _UPSERTS:
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        columns = ["business_no", "record_id", "updated_at"]
        if table is order_status:
            columns += ["status", "occurred_at"]
        else:
            columns += ["payload"]
        if table is sink_rows:
            columns.append("line")
        statement = dialect.insert(table).values({c: bindparam(c) for c in columns})
        changed = [c for c in columns if c not in ("business_no", "line")]
        keys = ["line", "business_no"] if table is sink_rows else ["business_no"]
        _UPSERTS[key] = statement.on_conflict_do_update(
            index_elements=keys,
            set_={c: statement.excluded[c] for c in changed},
            # An order's status never moves backwards.
            where=(
                order_status.c.occurred_at < statement.excluded.occurred_at
                if table is order_status
                else None
            ),
        )
    return _UPSERTS[key]


def occurred_at(record: Record) -> datetime:
    """A status record's `occurred_at`, in UTC (a time without zone is taken as UTC)."""
    return payload_occurred_at(record.payload)


def payload_occurred_at(payload: dict[str, Any]) -> datetime:
    """`occurred_at` of a status record's payload."""
    value = datetime.fromisoformat(str(payload["occurred_at"]))
    return as_utc(value)


def write_table_sink(conn: Connection, record: Record, *, table: str, now: datetime) -> None:
    """Upsert `record` into the sink table `table`. Never moves an order's status
    backwards."""
    sink = TABLES[table]
    conn.execute(_upsert(conn, sink), _sink_row(sink, record, now))


def write_table_sink_all(
    conn: Connection, batch: Sequence[Record], *, table: str, now: datetime
) -> None:
    """`write_table_sink` of several records, in order, in one executemany."""
    if not batch:
        return
    sink = TABLES[table]
    conn.execute(_upsert(conn, sink), [_sink_row(sink, record, now) for record in batch])


def _sink_row(table: Table, record: Record, now: datetime) -> dict[str, Any]:
    values: dict[str, Any] = {
        "business_no": record.business_no,
        "record_id": record.id,
        "updated_at": now,
    }
    if table is order_status:
        values |= {"status": str(record.payload["status"]), "occurred_at": occurred_at(record)}
    else:
        values["payload"] = record.payload
        if table is sink_rows:
            values["line"] = record.line
    return values


def deliver_http(
    client: httpx.Client,
    record: Record,
    *,
    url: str,
    delivered: DeliveredStatuses,
    timeout_s: float,
    signing_secret: SecretStr | None = None,
    clock: Callable[[], float] = time.time,
) -> int:
    """POST `record` to `url`, with `Idempotency-Key: <id>` and `X-Attempt: <attempt
    number>` (a downstream sees a repeat as a later attempt); with a `signing_secret`
    (`whsec_…`), signed as Standard Webhooks do, over the exact bytes sent: `webhook-id`
    (the record id), `webhook-timestamp` (`clock()`, at this attempt) and
    `webhook-signature`. Returns the answer's status code. Raises `DeliveryFailed` (with
    the `http_status` of the answer, if any) unless that code is in `delivered`, or when
    none came within `timeout_s`, one deadline from connect to last byte."""
    content = _body(record)
    headers = _headers(record)
    if signing_secret is not None:
        key = standard_webhooks.decode_secret(signing_secret.get_secret_value())
        headers |= standard_webhooks.signed_headers(
            key, msg_id=record.id, timestamp_s=int(clock()), body=content
        )
    shown = redact_url(url)
    try:
        with deadline(timeout_s):
            response = client.post(url, content=content, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise DeliveryFailed(f"POST {shown}: {type(exc).__name__}") from exc
    if response.status_code not in delivered:
        retry_after_s = retry_after(response, now_s=clock())
        if retry_after_s is not None:
            raise DeliveryFailed(
                f"POST {shown}: HTTP {response.status_code}, Retry-After {retry_after_s:g} s",
                http_status=response.status_code,
                retry_after_s=retry_after_s,
            )
        raise DeliveryFailed(
            f"POST {shown}: HTTP {response.status_code}", http_status=response.status_code
        )
    return response.status_code


def retry_after(response: httpx.Response, *, now_s: float) -> float | None:
    """The seconds a 429 or 503 answer asks to wait (`Retry-After`: seconds, or an HTTP
    date), at most `MAX_RETRY_AFTER_S`; None for another answer, or one that asks nothing
    (or nothing readable)."""
    if response.status_code not in (429, 503):
        return None
    value = response.headers.get("retry-after", "").strip()
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT
        when = when.replace(tzinfo=UTC)
    return min(max(0.0, when.timestamp() - now_s), MAX_RETRY_AFTER_S)


def _body(record: Record) -> bytes:
    """The HTTP sink's body: compact JSON in UTF-8, as httpx writes `json=` (serialized
    once, so the bytes signed are the bytes sent)."""
    value = {
        "id": record.id,
        "line": record.line,
        "business_no": record.business_no,
        "payload": record.payload,
    }
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _headers(record: Record) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Idempotency-Key": record.id,
        "X-Attempt": str(record.attempts),
    }


def redact_url(url: str) -> str:
    """`url` without credentials or query (they may hold secrets): scheme, host, path."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urllib.parse.urlunsplit((parts.scheme, f"{host}{port}", parts.path, "", ""))


class _Deadlines(threading.local):
    """The deadline (monotonic seconds) of the request this thread is making, if any."""

    at_s: float | None = None


_DEADLINES = _Deadlines()


@contextlib.contextmanager
def deadline(timeout_s: float) -> Iterator[None]:
    """Every network step of the requests this thread makes within the block (through a
    `deadline_transport`) ends `timeout_s` from now at the latest."""
    previous = _DEADLINES.at_s
    _DEADLINES.at_s = time.monotonic() + timeout_s
    try:
        yield
    finally:
        _DEADLINES.at_s = previous


def _left(timeout_s: float | None, late: type[Exception]) -> float | None:
    """A step's timeout, cut to what is left before the thread's deadline; raises `late`
    when none is left."""
    at_s = _DEADLINES.at_s
    if at_s is None:
        return timeout_s
    left_s = at_s - time.monotonic()
    if left_s <= 0:
        raise late("the request's deadline passed")
    return left_s if timeout_s is None else min(timeout_s, left_s)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(
            ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)
        )
        return _DeadlineStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's network backend, each step within the thread's deadline."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(
            self._inner.connect_tcp(host, port, left, local_address, socket_options)
        )

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_unix_socket(path, left, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def deadline_transport() -> httpx.HTTPTransport:
    """The HTTP sink's transport: pooled with keep-alive (`HTTP_LIMITS`), every request
    made within a `deadline` cut short at it. Raises `RuntimeError` when httpx's transport
    is not built as this relies on (its httpcore pool's network backend)."""
    transport = httpx.HTTPTransport(limits=HTTP_LIMITS)
    pool = getattr(transport, "_pool", None)
    if not isinstance(pool, httpcore.ConnectionPool) or not hasattr(pool, "_network_backend"):
        raise RuntimeError("httpx's transport has no httpcore pool's network backend to wrap")
    pool._network_backend = _DeadlineBackend(pool._network_backend)
    return transport


def make_http_client(transport: httpx.BaseTransport | None = None) -> httpx.Client:
    """The HTTP sink's client, one per process, shared by its delivery threads: pooled
    with keep-alive (as many kept-alive connections as a line may have deliveries in
    flight in one process), bounded timeouts, no redirects followed; over `transport`
    when given (`app.delivery.traced_http`)."""
    return httpx.Client(
        timeout=HTTP_TIMEOUT_S,
        follow_redirects=False,
        transport=transport or deadline_transport(),
    )


def stored_rows(
    conn: Connection, *, table: str, line: str, business_nos: list[str]
) -> dict[str, tuple[str, Any]]:
    """`{business_no: (record_id, payload)}` the sink table `table` holds for `line`."""
    sink = TABLES[table]
    query = select(sink.c.business_no, sink.c.record_id, sink.c.payload).where(
        among(conn, sink.c.business_no, business_nos)
    )
    if sink is sink_rows:
        query = query.where(sink_rows.c.line == line)
    return {row[0]: (row[1], row[2]) for row in conn.execute(query)}


def newest_statuses(conn: Connection, business_nos: list[str]) -> dict[str, datetime]:
    """`{business_no: occurred_at}` of the newest status the table sink holds."""
    query = select(order_status.c.business_no, order_status.c.occurred_at).where(
        among(conn, order_status.c.business_no, business_nos)
    )
    return {row[0]: row[1] for row in conn.execute(query)}
