"""The downstream of the delivery scenario, in a process of its own (so that its CPU shows
apart from the pipeline's): `python -m app.bench.downstream PORT DELAY_MS`.

Plain HTTP/1.1 on asyncio streams (uvloop when installed), keep-alive, bodies framed by
`content-length` (what httpx and the bench's load generator send). Any request but
`GET /stats` is read whole, answered `200 {}` after DELAY_MS, and counted: requests,
distinct `Idempotency-Key` headers, and the most requests it held at once. `GET /stats`
answers those counts as JSON, at once."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field

STATS_PATH = "/stats"
# Connections waiting to be accepted: the pipeline's and the reference's workers open a
# few; the bench's own check of this server opens many at once.
BACKLOG = 1024
_OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


@dataclass
class Counts:
    """What the downstream has seen since it started."""

    requests: int = 0
    keys: set[str] = field(default_factory=set)
    in_flight: int = 0
    max_in_flight: int = 0

    def as_json(self) -> bytes:
        return json.dumps(
            {
                "requests": self.requests,
                "distinct_keys": len(self.keys),
                "max_in_flight": self.max_in_flight,
            }
        ).encode()


def _head(raw: bytes) -> tuple[str, str, int, str | None, bool]:
    """Method, path, content length, Idempotency-Key (or None), and whether the client
    asked to close, from a request's head."""
    request_line, *header_lines = raw.decode("latin-1").split("\r\n")
    method, path, _version = request_line.split(" ", 2)
    length, key, close = 0, None, False
    for line in header_lines:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "idempotency-key":
            key = value.strip()
        elif name == "connection":
            close = value.strip().lower() == "close"
    return method, path, length, key, close


async def _serve(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counts: Counts, delay_s: float
) -> None:
    try:
        while True:
            method, path, length, key, close = _head(await reader.readuntil(b"\r\n\r\n"))
            if length:
                await reader.readexactly(length)
            if method == "GET" and path == STATS_PATH:
                body = counts.as_json()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
            else:
                counts.requests += 1
                if key is not None:
                    counts.keys.add(key)
                counts.in_flight += 1
                counts.max_in_flight = max(counts.max_in_flight, counts.in_flight)
                try:
                    await asyncio.sleep(delay_s)
                finally:
                    counts.in_flight -= 1
                writer.write(_OK)
            await writer.drain()
            if close:
                return
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        return  # the client went away, or sent what this server does not read
    finally:
        writer.close()


async def serve(port: int, *, delay_ms: float) -> None:
    """Serve on 127.0.0.1:`port` until the process is stopped."""
    counts = Counts()
    delay_s = delay_ms / 1000

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _serve(reader, writer, counts, delay_s)

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=BACKLOG)
    async with server:
        await server.serve_forever()


def main() -> None:
    port, delay_ms = int(sys.argv[1]), float(sys.argv[2])
    try:
        import uvloop  # noqa: PLC0415 - the fastest loop, when installed (uvicorn's extra)
    except ImportError:
        asyncio.run(serve(port, delay_ms=delay_ms))
        return
    uvloop.run(serve(port, delay_ms=delay_ms))


if __name__ == "__main__":
    main()
