"""Redis with an append-only file fsynced every second, lost with its host under load: it
comes back with its data and its epoch, but without the writes that were not yet on disk.
A process kill alone loses nothing (the file's writes are in the OS's cache), so the test
kills the server and then cuts its file back to a size it had earlier, as an OS crash
would. The records whose message went with the cut are pushed again by the lost-message
check, and every accepted record runs once."""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from app.admission.push import EPOCH_KEY
from app.local.embedded_redis import answers, server_binary
from tests.support.messages import queued_ids
from tests.support.processes import free_port, wait_for
from tests.support.runs import overlapping, runs_by_record, use_runs_log

pytestmark = pytest.mark.timeout(240)


class AofRedis:
    """A Redis-compatible server keeping an append-only file, fsynced every second."""

    def __init__(self, workdir) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for(lambda: answers(self.url), timeout_s=20, what="the AOF server to answer")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def incremental_file(self) -> Path:
        """The append-only file the server is writing now (Redis 7's multi-part layout)."""
        found = sorted(self.workdir.glob("**/*.incr.aof"))
        assert found, list(self.workdir.iterdir())
        return found[-1]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def test_redis_killed_with_its_last_second_unsynced_loses_no_record(harness, tmp_path):
    server = AofRedis(tmp_path / "aof")
    server.start()
    try:
        log = use_runs_log(harness, tmp_path)
        harness.configure(
            redis_url=server.url,
            lost_after_seconds="2",
            lost_check_interval_seconds="2",
            lines__order__batch_size="1",
        )
        client = harness.start_intake()
        client.timeout = httpx.Timeout(30)
        harness.start_beat()
        accepted: list[str] = []
        stop = threading.Event()

        def load() -> None:
            n = 0
            while not stop.is_set() and n < 2000:
                body = {"business_no": f"A-{n}", "sleep_s": 0.005}
                response = client.post("/v1/order", json=body, headers={"x-nonce": f"a-{n}"})
                if response.status_code in (200, 202):
                    accepted.append(response.json()["id"])
                n += 1

        producer = threading.Thread(target=load, daemon=True)
        producer.start()
        wait_for(lambda: len(accepted) >= 300, timeout_s=60, what="300 accepted records")
        aof = server.incremental_file()
        synced_size = aof.stat().st_size  # what an fsync had put on disk, say
        synced_with = len(accepted)
        wait_for(lambda: len(accepted) >= synced_with + 100, timeout_s=60, what="100 more")
        server.kill()
        killed_with = len(accepted)
        with aof.open("r+b") as file:  # the OS crashed: what came after is gone
            file.truncate(synced_size)
        server.start()  # from its append-only file, cut short
        stop.set()
        producer.join(timeout=60)
        assert not producer.is_alive()

        rt = harness.runtime()
        stored = {r.id: r for r in harness.records()}
        assert rt.redis.exists(EPOCH_KEY), "the epoch was lost: not a partial loss"
        epoch = rt.pusher.epoch()
        on_queue = set(queued_ids(rt.redis, "order"))
        lost = [
            i
            for i in accepted[:killed_with]
            if stored[i].status.value == "enqueued"
            and stored[i].queue_epoch == epoch
            and i not in on_queue
        ]
        print(f"\nmessages lost with the unsynced end of the file: {len(lost)} of {killed_with}")
        assert lost, "the cut lost no message: the test tested nothing"

        harness.start_worker("order", pool="prefork", concurrency=2)
        final = harness.wait_until_final(set(accepted), timeout_s=120)
        assert {r.status.value for r in final.values()} == {"done"}
        runs = runs_by_record(log)
        assert overlapping(runs) == {}
        assert {i: len(spans) for i, spans in runs.items()} == dict.fromkeys(accepted, 1)
    finally:
        server.stop()
