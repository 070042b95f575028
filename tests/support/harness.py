"""One test's pipeline: its settings (as environment variables, shared with the processes it
starts), an in-process intake on a free port, worker and beat subprocesses, and the journal."""

from __future__ import annotations

import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import func, select, text

from app.config.settings import Settings, load_settings
from app.intake.main import create_app
from app.intake.signing import sign
from app.journal.models import Record, RecordStatus, records
from app.local.processes import Children
from app.wiring.runtime import Runtime
from tests.support.processes import Component, free_port, wait_for

FINAL = {RecordStatus.DONE, RecordStatus.DEAD, RecordStatus.REJECTED}
# How long teardown lets the components stop on SIGTERM, together, before it kills their
# process groups. A prefork worker takes over 2 s to stop even when idle (each pool process
# sleeps 1 s on its way out), so teardown does not wait for it: a test that depends on a
# graceful stop makes it itself, before teardown.
TEARDOWN_GRACE_S = 0.25


class IntakeServer:
    """The real intake app under uvicorn, in a thread, on a free port."""

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            create_app(settings), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> IntakeServer:
        self.thread.start()
        wait_for(lambda: self.server.started, timeout_s=15, what="intake to listen")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


class Harness:
    """Everything one test runs; `close()` stops all of it."""

    def __init__(
        self, *, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.env = dict(env)
        self.tmp_path = tmp_path
        self.monkeypatch = monkeypatch
        # What it started, stopped together by `close()`; `components` lists them (a test
        # may add one it made itself).
        self.children = Children(env=self.env)
        self.components = self.children.started
        self.intakes: list[IntakeServer] = []
        self.runtimes: list[Runtime] = []
        self.clients: list[httpx.Client] = []
        for name, value in env.items():
            monkeypatch.setenv(name, value)

    def configure(self, **variables: str) -> None:
        """Set `PIPELINE_<NAME>` variables for this test and the processes it starts."""
        for name, value in variables.items():
            key = f"PIPELINE_{name.upper()}"
            self.env[key] = value
            self.monkeypatch.setenv(key, value)

    def settings(self) -> Settings:
        return load_settings()

    def runtime(self) -> Runtime:
        rt = Runtime.build(self.settings())
        self.runtimes.append(rt)
        return rt

    def start_intake(self) -> httpx.Client:
        server = IntakeServer(self.settings()).start()
        self.intakes.append(server)
        client = httpx.Client(base_url=server.url, timeout=30)
        self.clients.append(client)
        return client

    def _component(self, *args: str) -> Component:
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(args))[:80]
        log_path = self.tmp_path / f"{slug}-{len(self.components)}.log"
        component = Component(list(args), env=self.env, log_path=log_path)
        self.children.add(component)
        return component

    def start_worker(
        self,
        line: str,
        *,
        pool: str | None = "solo",
        concurrency: int | None = 1,
        wait: bool = True,
    ) -> Component:
        """A `pipeline worker LINE`; `pool` or `concurrency` None: the product's default."""
        options = [
            *(("--pool", pool) if pool else ()),
            *(("--concurrency", str(concurrency)) if concurrency else ()),
        ]
        worker = self._component("worker", line, *options)
        if wait:
            worker.wait_for_output(" ready.", timeout_s=40)
        return worker

    def start_beat(self, *, wait: bool = True, scheduler: str | None = None) -> Component:
        """A `pipeline beat`, with the scheduler class `scheduler` (module:Class) if given."""
        beat = self._component("beat", *(("--scheduler", scheduler) if scheduler else ()))
        if wait:
            beat.wait_for_output("beat: Starting", timeout_s=40)
        return beat

    def run(self, *args: str) -> Component:
        return self._component(*args)

    # The journal, read directly.

    def records(self) -> list[Record]:
        rt = self.runtimes[0] if self.runtimes else self.runtime()
        with rt.engine.connect() as conn:
            return [Record.from_row(row) for row in conn.execute(select(records))]

    def record_count(self) -> int:
        rt = self.runtimes[0] if self.runtimes else self.runtime()
        with rt.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(records)).scalar_one())

    def rows(self, sql: str) -> list[Any]:
        rt = self.runtimes[0] if self.runtimes else self.runtime()
        with rt.engine.connect() as conn:
            return list(conn.execute(text(sql)))

    def statuses(self) -> dict[str, str]:
        """Each record's status, by id: two columns, cheap enough to poll."""
        rt = self.runtimes[0] if self.runtimes else self.runtime()
        with rt.engine.connect() as conn:
            return {row[0]: row[1] for row in conn.execute(select(records.c.id, records.c.status))}

    def wait_until_final(self, ids: set[str], *, timeout_s: float = 90) -> dict[str, Record]:
        """Wait until every record of `ids` is done, dead or rejected; return them, read
        once they all are."""
        final = {status.value for status in FINAL}
        latest: dict[str, str] = {}

        # Polls read ids and statuses only: with thousands of records, building each
        # Record twenty times a second took a core the pipeline under test needs.
        def all_final() -> bool:
            latest.clear()
            latest.update({i: s for i, s in self.statuses().items() if i in ids})
            return len(latest) == len(ids) and all(s in final for s in latest.values())

        try:
            wait_for(all_final, timeout_s=timeout_s, what=f"{len(ids)} records to finish")
        except AssertionError:
            counts: dict[str, int] = {}
            for status in latest.values():
                counts[status] = counts.get(status, 0) + 1
            logs = "\n".join(c.output()[-2000:] for c in self.components)
            raise AssertionError(f"records not final: {counts}\n{logs}") from None
        return {r.id: r for r in self.records() if r.id in ids}

    def close(self) -> None:
        # All are asked at once and given one grace period together, then what is left is
        # killed: their shutdowns overlap, and five components cost one grace, not five.
        self.children.stop_all(timeout_s=TEARDOWN_GRACE_S, shared=True)
        for client in self.clients:
            client.close()
        for server in self.intakes:
            server.stop()
        for rt in self.runtimes:
            rt.close()


def signed_headers(
    key_id: str,
    secret: str,
    body: bytes,
    *,
    nonce: str | None = None,
    timestamp: int | None = None,
) -> dict[str, str]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    nonce = nonce or uuid.uuid4().hex
    return {
        "content-type": "application/json",
        "x-key-id": key_id,
        "x-timestamp": ts,
        "x-nonce": nonce,
        "x-signature": sign(secret, timestamp=ts, nonce=nonce, body=body),
    }
