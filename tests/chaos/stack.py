"""A whole pipeline for chaos tests: its own Redis on a free port (so it can be killed and
restarted), intake, worker and beat processes, a recording downstream, concurrent clients
that retry what they were never answered, and the ledger check at the end."""

from __future__ import annotations

import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from app.journal.models import RecordStatus
from app.local.embedded_redis import RedisServer
from tests.support.harness import Harness
from tests.support.processes import TLS_CONTEXT, Component, free_port, wait_for
from tests.support.recorder import Recorder

LINES = ("order", "refund", "status")
BASE_TIME = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Accepted:
    line: str
    business_no: str
    record_id: str
    occurred_at: datetime | None = None
    status: str | None = None


@dataclass
class Ledger:
    """Every 2xx answer the clients got."""

    accepted: list[Accepted] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    retries: int = 0

    def add(self, item: Accepted) -> None:
        with self.lock:
            self.accepted.append(item)

    def count(self) -> int:
        with self.lock:
            return len(self.accepted)


class ChaosStack:
    """order: table sink; refund: HTTP sink (the recorder); status: table sink."""

    def __init__(self, harness: Harness, tmp_path: Path) -> None:
        self.harness = harness
        self.redis = RedisServer(port=free_port(), workdir=tmp_path / "redis")
        self.recorder = Recorder().start()
        self.intake_port = free_port()
        self.intake: Component | None = None
        self.workers: dict[str, Component] = {}
        self.beat: Component | None = None
        self.ledger = Ledger()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.intake_port}"

    def start(self, **settings: str) -> ChaosStack:
        self.redis.start()
        self.harness.configure(
            redis_url=self.redis.url,
            intake_port=str(self.intake_port),
            lines__refund__downstream_url=f"{self.recorder.url}/refunds",
            visibility_timeout_seconds="20",
            sweep_interval_seconds="0.5",
            received_grace_seconds="2",
            **settings,
        )
        # Start everything at once, then wait for each: startup is most of a worker's cost.
        self.intake = self.harness.run("intake")
        for line in LINES:
            self.workers[line] = self.harness.start_worker(
                line, pool="prefork", concurrency=2, wait=False
            )
        self.beat = self.harness.start_beat(wait=False)
        wait_for(self._intake_ready, timeout_s=40, what="the intake to listen")
        for worker in self.workers.values():
            worker.wait_for_output(" ready.", timeout_s=40)
        self.beat.wait_for_output("beat: Starting", timeout_s=40)
        return self

    def start_intake(self) -> None:
        self.intake = self.harness.run("intake")
        wait_for(self._intake_ready, timeout_s=30, what="the intake to listen")

    def _intake_ready(self) -> bool:
        url = f"{self.base_url}/healthz"
        try:
            return httpx.get(url, timeout=1, verify=TLS_CONTEXT).status_code == 200
        except httpx.HTTPError:
            return False

    def start_worker(self, line: str) -> Component:
        self.workers[line] = self.harness.start_worker(line, pool="prefork", concurrency=2)
        return self.workers[line]

    def stop(self) -> None:
        self.recorder.stop()
        self.redis.stop()

    # Load.

    def _post(self, client: httpx.Client, line: str, body: dict[str, object]) -> dict[str, str]:
        """Post until answered 2xx; the same nonce on every try (the dedup key)."""
        headers = {"x-nonce": uuid.uuid4().hex}
        deadline = time.monotonic() + 120
        while True:
            try:
                response = client.post(f"/v1/{line}", json=body, headers=headers)
                if response.status_code in (200, 202):
                    answer: dict[str, str] = response.json()
                    return answer
                assert response.status_code == 503, response.text
            except httpx.TransportError:
                pass
            with self.ledger.lock:
                self.ledger.retries += 1
            assert time.monotonic() < deadline, f"no 2xx for {line} {body} within 120 s"
            time.sleep(0.2)  # a client's pause before it tries again, as a real one would

    def load(self, total: int = 2100, *, clients: int = 16) -> None:
        """Post `total` records across the three lines from concurrent clients."""
        rng = random.Random(total)

        def produce(client_no: int) -> None:
            with httpx.Client(base_url=self.base_url, timeout=10) as client:
                for n in range(client_no, total, clients):
                    line = LINES[n % 3]
                    body: dict[str, object] = {"business_no": f"{line[0].upper()}-{n}"}
                    occurred_at = None
                    if line == "status":
                        body["business_no"] = f"S-{n % 97}"
                        occurred_at = BASE_TIME + timedelta(seconds=rng.randrange(10**6))
                        body |= {"status": f"st-{n}", "occurred_at": occurred_at.isoformat()}
                    answer = self._post(client, line, body)
                    self.ledger.add(
                        Accepted(
                            line,
                            str(body["business_no"]),
                            answer["id"],
                            occurred_at,
                            str(body.get("status")) if line == "status" else None,
                        )
                    )

        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(produce, range(clients)))

    def load_with_fault(self, fault, *, total: int = 2100, after: int = 500) -> None:
        """Run `fault()` once `after` records have been accepted, while the load goes on."""
        errors: list[BaseException] = []

        def trigger() -> None:
            try:
                wait_for(lambda: self.ledger.count() >= after, timeout_s=120, what="load")
                fault()
            except BaseException as exc:  # noqa: BLE001 - reported to the test below
                errors.append(exc)

        thread = threading.Thread(target=trigger)
        thread.start()
        self.load(total)
        thread.join(timeout=300)
        assert not errors, errors

    # The ledger.

    def check(self, *, timeout_s: float = 180, repeats_allowed: bool = False) -> dict[str, int]:
        """Every accepted record done; every refund delivered; one table row per
        business_no, at the newest status; no two deliveries of a refund under one attempt,
        and a later delivery always from a later attempt (never two at once). A refund
        delivered more than once is allowed only with `repeats_allowed` (a worker killed
        while it held the record, or an outcome the journal could not take); the ledger
        names those records. Returns the figures."""
        accepted = list(self.ledger.accepted)
        ids = {a.record_id for a in accepted}
        assert len(ids) == len(accepted), "two answers named the same record"
        final = self.harness.wait_until_final(ids, timeout_s=timeout_s)
        not_done = [r for r in final.values() if r.status is not RecordStatus.DONE]
        assert not not_done, f"{len(not_done)} accepted records did not end done"

        refunds = {a.record_id for a in accepted if a.line == "refund"}
        attempts_of: dict[str, list[int]] = {}
        for r in self.recorder.snapshot():  # in the order they arrived
            if r.path == "/refunds" and r.answered < 300:
                attempts_of.setdefault(r.body["id"], []).append(int(r.headers["X-Attempt"]))
        deliveries = sum(len(found) for found in attempts_of.values())
        lost = refunds - set(attempts_of)
        repeated = {i: found for i, found in attempts_of.items() if len(found) > 1}
        # Each attempt holds the record's lease until its outcome: a later delivery from
        # an earlier (or the same) attempt would be two deliveries at once.
        at_once = {i: found for i, found in repeated.items() if found != sorted(set(found))}

        orders = {a.business_no: a.record_id for a in accepted if a.line == "order"}
        rows = self.harness.rows("SELECT business_no, record_id FROM orders")
        assert len(rows) == len({row[0] for row in rows})
        assert {row[0] for row in rows} == set(orders)
        lost |= {orders[bn] for bn in set(orders) - {row[0] for row in rows}}

        newest: dict[str, Accepted] = {}
        for a in accepted:
            if a.line != "status" or a.occurred_at is None:
                continue
            best = newest.get(a.business_no)
            if best is None or (best.occurred_at is not None and a.occurred_at > best.occurred_at):
                newest[a.business_no] = a
        status_sql = "SELECT business_no, status FROM order_status"
        status_rows = {row[0]: row[1] for row in self.harness.rows(status_sql)}
        assert status_rows == {bn: a.status for bn, a in newest.items()}

        figures = {
            "accepted": len(accepted),
            "done": len(final) - len(not_done),
            "lost": len(lost),
            "duplicate_deliveries": deliveries - len(attempts_of),
            "records_delivered_twice_at_once": len(at_once),
            "client_retries": self.ledger.retries,
        }
        print(f"\nledger: {figures}")
        if repeated:
            # Which records, and from which attempts: each repeat is an attempt whose
            # outcome was never recorded (its worker was killed, or the journal was down).
            print(f"ledger: delivered more than once (record: attempts): {repeated}")
        assert not lost, f"lost: {sorted(lost)[:10]}"
        assert not at_once, f"delivered twice at once (record: attempts): {at_once}"
        if not repeats_allowed:
            assert not repeated, f"delivered more than once (record: attempts): {repeated}"
        return figures
