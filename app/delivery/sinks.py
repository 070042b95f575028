"""The sinks: where an attempt delivers its record. Both built-in ones are idempotent.

- Table sink: upserts by business number into the line's table (`sink = table:<name>`) in
  the journal's database, in the same transaction that claims the record and marks it
  done; `sink_rows` is keyed by (line, business number), and `order_status` keeps the
  newest `occurred_at`. A record the table refuses fails alone (`write_rows`).
- HTTP sink: POSTs `{id, line, business_no, payload}` with `Idempotency-Key: <id>` and
  `X-Attempt: <attempt number>`, signed as Standard Webhooks do when the line has a
  `signing_secret`, over an async client with a kept-alive pool (`http_session`); an answer
  among the line's `delivered_statuses` (2xx by default) is delivered, anything else (or
  no whole answer within the line's `delivery_timeout_s`) is a failed attempt.
- Handler: the line's own function, on a thread, within the same `delivery_timeout_s`.

A delivery has one deadline: `delivery_timeout_s` bounds it from connect to the answer's
last byte (or the handler's return), however a downstream trickles its answer."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import email.utils
import json
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import aiohttp
import httpx
import redis
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer
from pydantic import SecretStr
from sqlalchemy import Connection, Table, bindparam, select
from sqlalchemy.dialects import postgresql, sqlite

from app import standard_webhooks
from app.clock import as_utc
from app.config.sink_settings import DeliveredStatuses
from app.errors import BrokerUnavailable, DeliveryFailed
from app.journal.attempt_log import MAX_HTTP_ANSWER_LENGTH
from app.journal.models import Record, order_status, orders, refunds, sink_rows
from app.journal.store import among
from app.telemetry.tracing import NO_TRACER, current_traceparent, traceparent_of

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


# How much of a refusal's answer the HTTP sink reads (bytes): the start of it is kept on
# the attempt's row, the rest never read (a huge answer costs no more than a small one).
MAX_ANSWER_BYTES = MAX_HTTP_ANSWER_LENGTH
# How much of a delivered answer's body the HTTP sink reads (bytes) before it closes the
# connection rather than read on: acknowledgements are small, and a downstream that sends
# megabytes with its 2xx costs no more than one that sends nothing.
MAX_DELIVERED_BYTES = 64 * 1024
# How much of it a record's `last_error` quotes, whitespace collapsed.
MAX_QUOTED_ANSWER = 300
# A URL within a downstream's answer (it may echo ours, secrets and all).
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")


# Client spans fail on these answers (OpenTelemetry's HTTP conventions for a client).
FIRST_ERROR_STATUS = 400


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


def write_rows(
    conn: Connection, batch: Sequence[Record], *, table: str, now: datetime
) -> dict[str, Exception]:
    """Write the sink rows of `batch` (records claimed in this transaction) into `table`:
    all at once in a savepoint, else (the table refused one) one savepoint each, so that a
    record the table refuses fails alone. Returns the refused records' errors by id."""
    if not batch or (len(batch) > 1 and _all_at_once(conn, batch, table=table, now=now)):
        return {}
    refused: dict[str, Exception] = {}
    for record in batch:
        try:
            with conn.begin_nested():
                write_table_sink(conn, record, table=table, now=now)
        except Exception as exc:  # noqa: BLE001 - e.g. a payload the table refuses
            refused[record.id] = exc
    return refused


def _all_at_once(conn: Connection, batch: Sequence[Record], *, table: str, now: datetime) -> bool:
    """`write_table_sink_all` in a savepoint; False, with nothing of it kept, when it fails."""
    try:
        with conn.begin_nested():
            write_table_sink_all(conn, batch, table=table, now=now)
    except Exception:  # noqa: BLE001 - the caller finds it again, record by record
        return False
    return True


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


async def deliver_http(  # noqa: PLR0913 - the line's delivery settings, keyword-only
    session: aiohttp.ClientSession,
    record: Record,
    *,
    url: str,
    delivered: DeliveredStatuses,
    timeout_s: float,
    signing_secret: SecretStr | None = None,
    tracer: Tracer = NO_TRACER,
    clock: Callable[[], float] = time.time,
) -> int:
    """POST `record` to `url`, with `Idempotency-Key: <id>` and `X-Attempt: <attempt
    number>` (a downstream sees a repeat as a later attempt); with a `signing_secret`
    (`whsec_…`), signed as Standard Webhooks do, over the exact bytes sent: `webhook-id`
    (the record id), `webhook-timestamp` (`clock()`, at this attempt) and
    `webhook-signature`. Within a span (of a trace), the request has a client span of its
    own, of `tracer`, whose traceparent it carries. Returns the answer's status code. Raises
    `DeliveryFailed` (with the `http_status` of the answer, if any, and the start of its body
    as `http_answer`, URLs redacted, quoted in its message) unless that code is in
    `delivered`, or when none came whole within `timeout_s`, one deadline from connect to
    last byte (of a refusal, to the last byte read: at most `MAX_ANSWER_BYTES`)."""
    content = _body(record)
    headers = _headers(record)
    if signing_secret is not None:
        key = standard_webhooks.decode_secret(signing_secret.get_secret_value())
        headers |= standard_webhooks.signed_headers(
            key, msg_id=record.id, timestamp_s=int(clock()), body=content
        )
    shown = redact_url(url)
    answer = ""
    with client_span(tracer, url, headers) as span:
        try:
            async with asyncio.timeout(timeout_s):
                async with session.post(
                    url, data=content, headers=headers, allow_redirects=False
                ) as response:
                    status, answered = response.status, response.headers
                    if status in delivered:
                        await _read_delivered(response)
                    else:
                        answer = await _answer_start(response.content)
        except TimeoutError as exc:
            span.set_status(StatusCode.ERROR, "no whole answer in time")
            raise DeliveryFailed(f"POST {shown}: no whole answer within {timeout_s:g} s") from exc
        except aiohttp.ClientError as exc:
            span.set_status(StatusCode.ERROR, type(exc).__name__)
            raise DeliveryFailed(f"POST {shown}: {type(exc).__name__}") from exc
        span.set_attribute("http.response.status_code", status)
        if status >= FIRST_ERROR_STATUS:
            span.set_status(StatusCode.ERROR, f"HTTP {status}")
    if status not in delivered:
        said = redact_urls(answer, url)
        words = quoted(said)
        retry_after_s = retry_after(status, answered, now_s=clock())
        if retry_after_s is not None:
            raise DeliveryFailed(
                f"POST {shown}: HTTP {status}, Retry-After {retry_after_s:g} s{words}",
                http_status=status,
                http_answer=said,
                retry_after_s=retry_after_s,
            )
        raise DeliveryFailed(
            f"POST {shown}: HTTP {status}{words}", http_status=status, http_answer=said
        )
    return status


async def _read_delivered(response: aiohttp.ClientResponse) -> None:
    """Read a delivered answer's body, which nothing uses, up to `MAX_DELIVERED_BYTES`, so
    that its connection can serve the next delivery. A longer body is not read on: the
    connection is closed instead."""
    read = 0
    while read <= MAX_DELIVERED_BYTES:
        chunk = await response.content.read(MAX_DELIVERED_BYTES + 1 - read)
        if not chunk:
            return
        read += len(chunk)
    response.close()


async def _answer_start(content: aiohttp.StreamReader) -> str:
    """The start of an answer's body: at most `MAX_ANSWER_BYTES`, decoded as UTF-8 (a
    character cut at the end is left out, an invalid byte replaced). The rest is never read:
    the connection is closed instead of kept."""
    data = bytearray()
    while len(data) < MAX_ANSWER_BYTES:
        chunk = await content.read(MAX_ANSWER_BYTES - len(data))
        if not chunk:
            break
        data += chunk
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return decoder.decode(bytes(data), final=False)  # no more characters than bytes


def quoted(answer: str) -> str:
    """How an error quotes a downstream's answer: `: ` and its start, whitespace collapsed,
    at most `MAX_QUOTED_ANSWER` characters; empty for an empty answer."""
    words = " ".join(answer.split())
    if not words:
        return ""
    if len(words) > MAX_QUOTED_ANSWER:
        words = words[: MAX_QUOTED_ANSWER - 1] + "…"
    return f": {words}"


@contextlib.contextmanager
def client_span(tracer: Tracer, url: str, headers: dict[str, str]) -> Iterator[Span]:
    """The request's client span, of `tracer`, when it is made within a span of a trace; its
    traceparent goes into `headers`. Else (and always for the no-op tracer: tracing is off)
    a span that records nothing, and no header."""
    if current_traceparent(tracer) is None:
        yield trace.INVALID_SPAN
        return
    parts = urllib.parse.urlsplit(url)
    attributes: dict[str, str | int] = {
        "http.request.method": "POST",
        "url.full": redact_url(url),
        "server.address": parts.hostname or "",
    }
    if parts.port is not None:
        attributes["server.port"] = parts.port
    with tracer.start_as_current_span("POST", kind=SpanKind.CLIENT, attributes=attributes) as span:
        traceparent = traceparent_of(span)
        if traceparent is not None:
            headers["traceparent"] = traceparent
        yield span


# A worker process whose every handler thread of a line is held by a call that overran
# says so here (`stuck_handlers`), for the line's health; the key lapses a minute after
# its last word, and goes when a call returns.
HANDLERS_STUCK_KEY = "pipeline:handlers_stuck:{line}:{process}"
HANDLERS_STUCK_TTL_S = 60


def stuck_handlers(client: redis.Redis, line: str) -> int:
    """How many worker processes say every handler thread of `line` is held. Raises
    `BrokerUnavailable`."""
    match = HANDLERS_STUCK_KEY.format(line=line, process="*")
    try:
        return sum(1 for _ in client.scan_iter(match=match, count=100))
    except redis.RedisError as exc:
        raise BrokerUnavailable(f"stuck handlers of {line}: {exc}") from exc


class HandlerThreads:
    """A handler line's calls in this process: each on a daemon thread of its own, at most
    `size` at once. A call that overruns its deadline cannot be stopped: it keeps its
    thread until it returns, and this process does not call its record again meanwhile.
    Used on the engine's loop only."""

    def __init__(self, line: str, *, size: int) -> None:
        self._line = line
        self._size = size
        # Records whose call has not returned, overrunning ones included.
        self._running: set[str] = set()
        self.stuck_key = HANDLERS_STUCK_KEY.format(
            line=line, process=f"{socket.gethostname()}:{os.getpid()}"
        )
        self.said_stuck = False  # whether `stuck_key` says so now

    @property
    def free(self) -> int:
        """Threads no call holds."""
        return self._size - len(self._running)

    def running(self, record_id: str) -> bool:
        """Whether a call of `record_id` has not returned yet."""
        return record_id in self._running

    async def call(
        self, handler: Callable[[Record], object], record: Record, *, timeout_s: float
    ) -> None:
        """Run `handler(record)` on a thread of its own (the engine starts a call only
        while `free`), within `timeout_s`. Raises what the handler raised, or `TimeoutError`
        when it has not returned by then: the attempt fails, and this process tries the
        record again only once this call has returned (a handler is idempotent, as every
        sink is)."""
        loop = asyncio.get_running_loop()
        returned: asyncio.Future[None] = loop.create_future()
        self._running.add(record.id)
        returned.add_done_callback(lambda done: self._returned(record.id, done))

        def run() -> None:
            error: BaseException | None = None
            try:
                handler(record)
            except Exception as exc:  # noqa: BLE001 - the attempt's, handed to the loop
                error = exc
            except BaseException as exc:  # noqa: BLE001 - SystemExit would stop the loop
                error = RuntimeError(f"the handler raised {type(exc).__name__}: {exc}")
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                loop.call_soon_threadsafe(_settle, returned, error)

        try:
            threading.Thread(target=run, name=f"handler-{self._line}", daemon=True).start()
        except RuntimeError:  # no thread could start: the call never began
            returned.cancel()
            raise
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(returned)
        except TimeoutError as exc:
            raise TimeoutError(
                f"the handler did not return within {timeout_s:g} s (its call runs on, "
                "holding one of the line's handler threads until it returns)"
            ) from exc

    def _returned(self, record_id: str, done: asyncio.Future[None]) -> None:
        self._running.discard(record_id)
        if not done.cancelled():
            done.exception()  # retrieved: a late error of an overrun call is no attempt's


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def retry_after(status: int, headers: Mapping[str, str], *, now_s: float) -> float | None:
    """The seconds a 429 or 503 answer asks to wait (`Retry-After`: seconds, or an HTTP
    date), at most `MAX_RETRY_AFTER_S`; None for another answer, or one that asks nothing
    (or nothing readable)."""
    if status not in (429, 503):
        return None
    value = (headers.get("Retry-After") or headers.get("retry-after") or "").strip()
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
    """The HTTP sink's body: compact JSON in UTF-8 (as httpx writes `json=`), serialized
    once, so the bytes signed are the bytes sent."""
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


def redact_urls(text: str, url: str = "") -> str:
    """`text` (a downstream's answer) with every URL in it redacted as `redact_url` does,
    and the secrets of `url` (the one it was sent to: its password and query values) taken
    out wherever they stand, in the forms an answer echoes them (as sent, percent-encoded,
    with `/` escaped as JSON may write it)."""
    for secret in _secrets_of(url):
        for form in {secret, urllib.parse.quote(secret, safe=""), secret.replace("/", "\\/")}:
            text = text.replace(form, "…")
    return _URL_IN_TEXT.sub(_redacted, text)


# A query value shorter than this is no secret (`?v=1`), and taking it out of an answer
# would cut its words apart.
MIN_SECRET_LENGTH = 4


def _secrets_of(url: str) -> list[str]:
    """The parts of `url` that may be secret: its password and its query's values, raw and
    decoded, longest first (so that no shorter one cuts a longer one apart)."""
    if not url:
        return []
    parts = urllib.parse.urlsplit(url)
    found = {parts.password or ""}
    for pair in parts.query.split("&"):
        raw = pair.partition("=")[2]
        found |= {raw, urllib.parse.unquote_plus(raw)}
    return sorted((s for s in found if len(s) >= MIN_SECRET_LENGTH), key=len, reverse=True)


def _redacted(found: re.Match[str]) -> str:
    text = found.group(0)
    url = text.rstrip(".,;:!?)]}")  # the sentence's punctuation, not the URL's
    try:
        return redact_url(url) + text[len(url) :]
    except ValueError:  # not a URL after all (a port out of range): none of it is kept
        return text.split("://", 1)[0] + "://…"


def make_http_client() -> httpx.Client:
    """The process's client for the pipeline's own checks (replay asking a line's check
    URL): bounded timeouts, no redirects followed."""
    return httpx.Client(timeout=HTTP_TIMEOUT_S, follow_redirects=False)


def http_session() -> aiohttp.ClientSession:
    """The HTTP sink's client, one per worker process, made on its delivery loop: a
    kept-alive pool per downstream (as many connections as deliveries in flight: the
    line's slots bound them), no redirects followed (each request says so)."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


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
