"""A small HTTP/1.1 load generator on asyncio: a fixed number of keep-alive connections,
each sending its next request as soon as the previous answer is read, for a fixed time.

Requests are built by a factory (so each can carry its own signature and nonce); latency
is measured from writing a request to reading the end of its answer."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# A request: method, path, headers, body.
Request = tuple[str, str, dict[str, str], bytes]
RequestFactory = Callable[[int], Request]


@dataclass
class LoadResult:
    """What one load run measured."""

    requests: int = 0
    duration_s: float = 0.0
    statuses: Counter[int] = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def rate(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0

    def percentile(self, q: float) -> float:
        """The `q` quantile (0..1) of the latencies, in seconds."""
        if not self.latencies_s:
            return 0.0
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _encode(request: Request, host: str) -> bytes:
    method, path, headers, body = request
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}", f"content-length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read_answer(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split(" ", 2)[1])
    length = 0
    for line in header_lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length:
        await reader.readexactly(length)
    return status


async def _connection(
    host: str,
    port: int,
    factory: RequestFactory,
    counter: list[int],
    deadline: float,
    result: LoadResult,
    total: int | None,
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.monotonic() < deadline:
            n = counter[0]
            if total is not None and n >= total:
                break
            counter[0] += 1
            data = _encode(factory(n), f"{host}:{port}")
            started = time.perf_counter()
            try:
                writer.write(data)
                status = await _read_answer(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                result.errors += 1
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                continue
            result.latencies_s.append(time.perf_counter() - started)
            result.statuses[status] += 1
            result.requests += 1
    finally:
        writer.close()


async def _run(
    url: str,
    factory: RequestFactory,
    *,
    concurrency: int,
    duration_s: float,
    total: int | None,
) -> LoadResult:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    result = LoadResult()
    counter = [0]
    started = time.monotonic()
    deadline = started + duration_s
    await asyncio.gather(
        *(
            _connection(host, port, factory, counter, deadline, result, total)
            for _ in range(concurrency)
        )
    )
    result.duration_s = time.monotonic() - started
    return result


def run_load(
    url: str,
    factory: RequestFactory,
    *,
    concurrency: int,
    duration_s: float,
    total: int | None = None,
) -> LoadResult:
    """Load `url` with `concurrency` connections for `duration_s` seconds, or until `total`
    requests were sent."""
    main = _run(url, factory, concurrency=concurrency, duration_s=duration_s, total=total)
    try:
        import uvloop  # noqa: PLC0415 - the fastest loop, when installed (uvicorn's extra)
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
