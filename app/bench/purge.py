"""One retention run in a process of its own, as the beat runs it (in the bench's process
it would take the load generator's interpreter lock): `python -m app.bench.purge`, with
the pipeline's settings in the environment. One JSON line on stdout: how many records
it deleted, in how many seconds."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

from app.config.settings import load_settings
from app.wiring.runtime import Runtime


def main() -> None:
    rt = Runtime.build(load_settings())
    try:
        started = time.monotonic()
        deleted = rt.retention.purge(now=datetime.now(UTC))
        seconds = time.monotonic() - started
    finally:
        rt.close()
    print(json.dumps({"deleted": deleted, "seconds": round(seconds, 3)}), flush=True)


if __name__ == "__main__":
    main()
