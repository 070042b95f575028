"""A small HTTP/1.1 load generator on asyncio: a fixed number of keep-alive connections,
each sending its next request as soon as the previous answer is read, for a fixed time.

Requests are built by a factory (so each can carry its own signature and nonce); latency
is measured from writing a request to reading the end of its answer."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
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
    # Percentiles measured elsewhere (wrk reports them, not each latency).
    known_percentiles: dict[float, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0

    def percentile(self, q: float) -> float:
        """The `q` quantile (0..1) of the latencies, in seconds."""
        if q in self.known_percentiles:
            return self.known_percentiles[q]
        if not self.latencies_s:
            return 0.0
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def merged(results: list[LoadResult]) -> LoadResult:
    """The runs of `results`, one after another, as one run."""
    total = LoadResult()
    for result in results:
        total.requests += result.requests
        total.duration_s += result.duration_s
        total.statuses.update(result.statuses)
        total.latencies_s.extend(result.latencies_s)
        total.errors += result.errors
    return total


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


# wrk: requests are built here (each signed with its own nonce) and handed to wrk's Lua
# as raw HTTP text; each wrk thread sends its own share, in order.
_WRK_SCRIPT = """
local requests = {}
local count = 0
local n = 0
local chunk = loadfile(os.getenv("BENCH_WRK_DIR") .. "/requests.lua")

setup = function(thread)
  count = count + 1
  thread:set("index", count)
end

init = function(args)
  requests = chunk()[index]
end

request = function()
  n = n % #requests + 1
  return requests[n]
end

done = function(summary, latency, requests)
  local out = io.open(os.getenv("BENCH_WRK_DIR") .. "/result.json", "w")
  out:write(string.format(
    '{"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "status_errors": %d, '
    .. '"other_errors": %d}',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
  out:close()
end
"""
WRK_THREADS = 2


def wrk_path() -> str | None:
    """The `wrk` binary, when installed."""
    return shutil.which("wrk")


def _lua_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "\\r")
    return '"' + escaped.replace("\n", "\\n") + '"'


def run_wrk(
    url: str,
    factory: RequestFactory,
    *,
    concurrency: int,
    duration_s: float,
    count: int,
    workdir: Path,
) -> LoadResult:
    """Load `url` with wrk: `concurrency` connections over `WRK_THREADS` threads for
    `duration_s`, sending `count` requests made by `factory` (reused in turn if wrk is
    faster than that)."""
    prepare_wrk(url, factory, count=count, workdir=workdir)
    return run_prepared_wrk(url, concurrency=concurrency, duration_s=duration_s, workdir=workdir)


def prepare_wrk(url: str, factory: RequestFactory, *, count: int, workdir: Path) -> None:
    """Write the `count` requests made by `factory` and wrk's script into `workdir`, for
    `run_prepared_wrk` (making and signing them takes a while: not while loading)."""
    parts = urlsplit(url)
    host = f"{parts.hostname}:{parts.port}"
    workdir.mkdir(parents=True, exist_ok=True)
    shares: list[list[str]] = [[] for _ in range(WRK_THREADS)]
    for n in range(count):
        shares[n % WRK_THREADS].append(_lua_string(_encode(factory(n), host).decode()))
    with (workdir / "requests.lua").open("w") as lua:
        lua.write("return {\n")
        for share in shares:
            lua.write("{" + ",\n".join(share) + "},\n")
        lua.write("}\n")
    (workdir / "script.lua").write_text(_WRK_SCRIPT)


def run_prepared_wrk(url: str, *, concurrency: int, duration_s: float, workdir: Path) -> LoadResult:
    """`run_wrk` with the requests `prepare_wrk` wrote into `workdir`."""
    (workdir / "result.json").unlink(missing_ok=True)
    wrk = wrk_path()
    assert wrk is not None
    subprocess.run(  # noqa: S603 - fixed arguments
        [
            *(wrk, "--threads", str(WRK_THREADS), "--connections", str(concurrency)),
            *("--duration", f"{duration_s:g}s", "--script", str(workdir / "script.lua"), url),
        ],
        env={**os.environ, "BENCH_WRK_DIR": str(workdir)},
        check=True,
        capture_output=True,
        timeout=duration_s + 120,
    )
    figures = json.loads((workdir / "result.json").read_text())
    result = LoadResult(
        requests=figures["requests"],
        duration_s=figures["duration_us"] / 1e6,
        errors=figures["other_errors"],
    )
    result.statuses[200] = figures["requests"] - figures["status_errors"]
    result.statuses[0] = figures["status_errors"]  # wrk counts non-2xx/3xx, not by code
    result.known_percentiles = {0.5: figures["p50_us"] / 1e6, 0.99: figures["p99_us"] / 1e6}
    return result
