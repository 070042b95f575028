"""The chaos stack spread over hosts in network namespaces: host `a` runs the intake and
the active beat, hosts `b` and `c` a worker of every line, and `c` also a standby beat.
Redis listens on the bridge's address; the journal (a PostgreSQL server that listens on
127.0.0.1 only) and the refund line's downstream (the recorder) are reached there through
a forwarder. The clients sign their requests: an intake that listens beyond loopback
takes no unsigned ones."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import httpx
from sqlalchemy.engine import make_url

from app.local.embedded_redis import RedisServer
from beat.lock import LOCK_KEY
from tests.chaos.stack import LINES, ChaosStack
from tests.support.harness import Harness, signed_headers
from tests.support.netns import Forwarder, NamespacedComponent, Network
from tests.support.processes import Component, free_port, wait_for

KEY_ID = "hosts"
SECRET = "a-secret-of-the-hosts-test"
# How long the order line's handler runs (the runs log's spans): long enough that a host
# cut mid-load holds some record, short enough for the load to drain quickly.
ORDER_RUN_S = 0.1


class HostsStack(ChaosStack):
    def __init__(self, harness: Harness, tmp_path: Path, network: Network) -> None:
        super().__init__(harness, tmp_path)
        self.network = network
        self.tmp_path = tmp_path
        # With a password: a server bound beyond loopback without one takes no clients.
        self.redis = RedisServer(
            port=free_port(),
            workdir=tmp_path / "redis",
            host=network.address,
            password=uuid.uuid4().hex,
        )
        self.forwarder: Forwarder | None = None
        self.beats: dict[str, Component] = {}
        self.pace_s = 0.0

    @property
    def base_url(self) -> str:
        return f"http://{self.network.hosts['a'].address}:{self.intake_port}"

    def _run_on(self, host: str, *args: str) -> Component:
        """`pipeline ARGS` on `host`, stopped with the harness's other components."""
        name = "-".join((host, *args))[:60].replace("/", "_")
        component = NamespacedComponent(
            self.network.hosts[host].namespace,
            list(args),
            env=self.harness.env,
            log_path=self.tmp_path / f"{name}-{len(self.harness.components)}.log",
        )
        self.harness.components.append(component)
        component.start()
        return component

    def start(self, **settings: str) -> HostsStack:
        bridge = self.network.address
        self.redis.start()
        database = make_url(self.harness.env["PIPELINE_DATABASE_URL"])
        database_port, recorder_port = free_port(), free_port()
        recorder_host, recorder_local_port = self.recorder.url.removeprefix("http://").split(":")
        self.forwarder = Forwarder(
            {
                (bridge, database_port): (database.host or "127.0.0.1", database.port or 5432),
                (bridge, recorder_port): (recorder_host, int(recorder_local_port)),
            },
            log_path=self.tmp_path / "forwarder.log",
        ).start()
        self.harness.configure(
            redis_url=self.redis.url,
            database_url=database.set(host=bridge, port=database_port).render_as_string(False),
            intake_host=self.network.hosts["a"].address,
            intake_port=str(self.intake_port),
            intake_keys=json.dumps({KEY_ID: SECRET}),
            dev_mode="false",
            lines__refund__downstream_url=f"http://{bridge}:{recorder_port}/refunds",
            sweep_interval_seconds="0.5",
            received_grace_seconds="2",
            **settings,
        )
        intake = self._run_on("a", "intake")
        for host in ("b", "c"):
            for line in LINES:
                self.workers[f"{host}-{line}"] = self._run_on(
                    host, "worker", line, "--pool", "prefork", "--concurrency", "2"
                )
        # Host a's beat first, so that it is the active one.
        self.beats["a"] = self._run_on("a", "beat")
        wait_for(self._intake_ready, timeout_s=40, what="the intake on host a to listen")
        self.intake = intake
        rt = self.harness.runtime()
        wait_for(
            lambda: self.lock_holder_pid(rt.redis) == self.beats["a"].pid,
            timeout_s=40,
            what="host a's beat to take the lock",
        )
        self.beats["c"] = self._run_on("c", "beat")
        for worker in self.workers.values():
            worker.wait_for_output(" ready.", timeout_s=40)
        self.beats["c"].wait_for_output("beat: Starting", timeout_s=40)
        return self

    @staticmethod
    def lock_holder_pid(redis_client) -> int | None:
        value = redis_client.get(LOCK_KEY)
        return None if value is None else int(value.decode().split(":")[1])

    def stop(self) -> None:
        super().stop()
        if self.forwarder is not None:
            self.forwarder.stop(timeout_s=5)

    def _post(self, client: httpx.Client, line: str, body: dict[str, object]) -> dict[str, str]:
        """Post, signed, until answered 2xx; the same nonce on every try (the dedup key).
        Each client then pauses `pace_s`, so that the load lasts through the cuts."""
        if line == "order":
            body = body | {"sleep_s": ORDER_RUN_S}
        raw = json.dumps(body).encode()
        nonce = uuid.uuid4().hex
        deadline = time.monotonic() + 120
        while True:
            headers = signed_headers(KEY_ID, SECRET, raw, nonce=nonce)
            try:
                response = client.post(f"/v1/{line}", content=raw, headers=headers)
                if response.status_code in (200, 202):
                    answer: dict[str, str] = response.json()
                    time.sleep(self.pace_s)
                    return answer
                assert response.status_code == 503, response.text
            except httpx.TransportError:
                pass
            with self.ledger.lock:
                self.ledger.retries += 1
            assert time.monotonic() < deadline, f"no 2xx for {line} {body} within 120 s"
            time.sleep(0.2)  # a client's pause before it tries again, as a real one would
