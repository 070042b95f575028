"""A line's global delivery limits hold across every worker: `delivery_rate` (a token
bucket in Redis) and `delivery_concurrency` (deliveries in flight)."""

from __future__ import annotations

import threading

import pytest
import redis

from app.delivery.limits import BUCKET_KEY, bucket_capacity
from tests.support.downstream import Gauged, post_records

pytestmark = pytest.mark.journal_independent

RATE = 50
STOP = "bucket-watch-stop"


class BucketWatch:
    """Every ask of a line's token bucket, on Redis's clock: the bucket script writes the
    tokens it leaves and its time (ms) on each ask, which MONITOR shows; what an ask
    granted is what the bucket held (refilled since the ask before) less what it left."""

    def __init__(self, redis_url: str, line: str) -> None:
        self._url = redis_url
        self._key = BUCKET_KEY.format(line=line)
        self._client = redis.Redis.from_url(redis_url, socket_timeout=10)
        self._monitor = self._client.monitor()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._failed: BaseException | None = None
        self.states: list[tuple[int, float]] = []  # (at_ms, tokens left), in order

    def start(self) -> BucketWatch:
        self._monitor.__enter__()
        self._thread.start()
        return self

    def _watch(self) -> None:
        try:
            while True:
                command = self._monitor.next_command()["command"].split()
                if command[:2] == ["ECHO", STOP]:
                    return
                if command[:2] == ["HSET", self._key]:
                    fields = dict(zip(command[2::2], command[3::2], strict=True))
                    self.states.append((int(float(fields["at_ms"])), float(fields["tokens"])))
        except BaseException as exc:  # noqa: BLE001 - grants() raises it
            self._failed = exc

    def stop(self) -> None:
        with redis.Redis.from_url(self._url, socket_timeout=5) as other:
            other.echo(STOP)
        self._thread.join(timeout=10)
        self._client.close()

    def grants(self, rate: float, capacity: float) -> list[tuple[int, float]]:
        """(at_ms, tokens granted) of each ask, in order."""
        assert self._failed is None, self._failed
        assert not self._thread.is_alive(), "the watch did not stop"
        grants: list[tuple[int, float]] = []
        tokens, at_ms = capacity, None
        for now_ms, left in self.states:
            if at_ms is not None:
                tokens = min(capacity, tokens + max(0, now_ms - at_ms) * rate / 1000)
            grants.append((now_ms, tokens - left))
            tokens, at_ms = left, now_ms
        return grants


def busiest_second(grants: list[tuple[int, float]]) -> float:
    """The most tokens granted within any one second (a sliding window)."""
    most, first, total = 0.0, 0, 0.0
    for at_ms, granted in grants:
        total += granted
        while at_ms - grants[first][0] >= 1000:
            total -= grants[first][1]
            first += 1
        most = max(most, total)
    return most


# Measured where the limit is kept, the bucket, on Redis's clock: arrivals at the downstream
# also carry each request's time in transit (the claim's commit, the request), which under
# pytest -n 3 let 74 requests land within one second of the 55 tokens it allows.
@pytest.mark.loads_machine
def test_three_worker_processes_never_send_more_than_the_bucket_allows_in_any_second(harness):
    downstream = Gauged().start()
    watch = BucketWatch(harness.env["PIPELINE_REDIS_URL"], "shipment")
    try:
        harness.configure(
            lines__shipment__downstream_url=f"{downstream.url}/in",
            lines__shipment__delivery_rate=str(RATE),
        )
        client = harness.start_intake()
        # Three worker processes, with the line's defaults, all ready first.
        workers = [
            harness.start_worker("shipment", pool=None, concurrency=None, wait=False)
            for _ in range(3)
        ]
        for worker in workers:
            worker.wait_for_output(" ready.", timeout_s=60)
        watch.start()
        ids = post_records(client, "shipment", 300, "RATE")
        final = harness.wait_until_final(ids, timeout_s=120)
        watch.stop()
        assert {record.status.value for record in final.values()} == {"done"}
        seen = downstream.snapshot()
        assert sorted(r.headers["Idempotency-Key"] for r in seen) == sorted(ids)  # once each
        capacity = bucket_capacity(RATE)
        grants = watch.grants(RATE, capacity)
        # Every delivery took a token (a claim that lost its record does not give one back).
        assert sum(granted for _at, granted in grants) >= 300 - 1e-6
        # What the bucket allows in any one second: what it holds and a second's tokens
        # (three workers each keeping 50/s would take 150 in a second).
        busiest = busiest_second(grants)
        assert busiest <= capacity + RATE + 1e-6, f"{busiest:g} tokens within one second"
        # And over the whole run: 300 deliveries took at least the time their tokens did.
        assert grants[-1][0] - grants[0][0] >= (300 - capacity) / RATE * 1000 - 1
        # The three workers shared the line: each one delivered some of it.
        rows = harness.rows("SELECT DISTINCT worker_pid FROM record_attempts")
        assert len(rows) == 3
    finally:
        watch.stop()
        downstream.stop()


def test_no_more_deliveries_in_flight_than_the_lines_concurrency_limit(harness):
    downstream = Gauged(delay_s=0.1).start()
    try:
        harness.configure(
            lines__shipment__downstream_url=f"{downstream.url}/in",
            lines__shipment__delivery_concurrency="3",
        )
        client = harness.start_intake()
        ids = post_records(client, "shipment", 60, "CONC")
        for _ in range(2):
            harness.start_worker("shipment", pool=None, concurrency=None)
        final = harness.wait_until_final(ids, timeout_s=120)
        assert {record.status.value for record in final.values()} == {"done"}
        assert len(downstream.snapshot()) == 60
        assert downstream.most_in_flight == 3
    finally:
        downstream.stop()
