"""Pollers of the status routes, in a process of their own (their threads would otherwise
take the load generator's interpreter lock): `python -m app.bench.pollers URL N SECONDS`.

Each of N threads asks for `/v1/lines` and `/metrics` in turn, back to back (an open status
page asks every 2 s: this is many pages at once), for SECONDS; then one JSON line on stdout
says how many answers came and how many were not 200."""

from __future__ import annotations

import json
import sys
import threading
import time

import httpx

PATHS = ("/v1/lines", "/metrics")


def poll(url: str, *, pollers: int, duration_s: float) -> dict[str, float]:
    """Poll `url` from `pollers` threads for `duration_s`; returns the counts."""
    counts = {"polls": 0, "not_ok": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + duration_s

    def run(n: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            while time.monotonic() < deadline:
                try:
                    ok = client.get(PATHS[n % len(PATHS)]).status_code == 200
                except httpx.HTTPError:
                    ok = False
                with lock:
                    counts["polls"] += 1
                    counts["not_ok"] += not ok
                n += 1

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(pollers)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=duration_s + 120)
    seconds = time.monotonic() - started
    return {**counts, "seconds": round(seconds, 2)}


def main() -> None:
    url, pollers, duration_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    print(json.dumps(poll(url, pollers=pollers, duration_s=duration_s)), flush=True)


if __name__ == "__main__":
    main()
