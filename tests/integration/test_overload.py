"""Bounded queues under concurrent producers, the three overflow policies, and isolation."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from app.admission.ledger import records_key
from app.clock import utcnow
from app.ids import new_id
from app.journal import store
from app.journal.models import Source
from app.journal.store import NewRecord, RecordFilter
from tests.support.metrics import metric, samples
from tests.support.processes import wait_for

PRODUCERS = 32
POSTS_EACH = 8
BOUND = 100


class DepthSampler:
    """Samples a queue's depth on its own connection until stopped: LLEN (its messages
    waiting), or with `records` the records the bound counts."""

    def __init__(self, client, queue: str, *, records: bool = False) -> None:
        self.client, self.queue = client, queue
        self.key = records_key(queue) if records else None
        self.samples: list[int] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.is_set():
            if self.key is None:
                self.samples.append(int(self.client.llen(self.queue)))
            else:
                self.samples.append(int(self.client.get(self.key) or 0))

    def __enter__(self) -> DepthSampler:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)


def flood(base_url: str, line: str) -> list[httpx.Response]:
    """32 producers posting at once; every answer is returned."""

    def produce(worker: int) -> list[httpx.Response]:
        with httpx.Client(base_url=base_url, timeout=60) as client:
            return [
                client.post(f"/v1/{line}", json={"business_no": f"P{worker}-{n}"})
                for n in range(POSTS_EACH)
            ]

    with ThreadPoolExecutor(PRODUCERS) as pool:
        return [r for batch in pool.map(produce, range(PRODUCERS)) for r in batch]


@pytest.mark.journal
@pytest.mark.parametrize("policy", ["defer", "reject", "caller_runs"])
def test_bound_holds_under_32_concurrent_producers(harness, policy):
    # One record to a message: the bound is then a count of records (test_batches has the
    # bound with several records to a message).
    harness.configure(
        lines__order__max_queue_length=str(BOUND),
        lines__order__sender_queue_share="1",
        lines__order__overflow=policy,
        lines__order__batch_size="1",
        # Every answer from its push, however loaded the machine: a request whose push
        # outlived the wait would be answered `received` (and its record deferred), and so
        # would one that waited for the push thread longer than half the sweeper's grace
        # (2.5 s by default: a loaded CI saw two and three such answers of 256).
        intake_push_wait_seconds="30",
        received_grace_seconds="120",
    )
    client = harness.start_intake()
    rt = harness.runtime()
    with DepthSampler(rt.redis, "order") as sampler:
        answers = flood(str(client.base_url), "order")
    assert len(sampler.samples) > 100
    assert max(sampler.samples) <= BOUND
    assert rt.redis.llen("order") == BOUND
    total = PRODUCERS * POSTS_EACH
    over = total - BOUND
    by_status: dict[str, list[httpx.Response]] = {}
    for answer in answers:
        key = f"{answer.status_code} {answer.json()['status']}"
        by_status.setdefault(key, []).append(answer)
    assert len(by_status["202 enqueued"]) == BOUND
    counts = {k: len(v) for k, v in by_status.items()}
    if policy == "defer":
        assert counts == {"202 enqueued": BOUND, "202 deferred": over}
        ids = {a.json()["id"] for a in answers}
        harness.start_worker("order", pool="prefork", concurrency=2)
        harness.start_beat()  # the sweeper drains the deferred records as room appears
        final = harness.wait_until_final(ids, timeout_s=120)
        assert {r.status.value for r in final.values()} == {"done"}
        assert len(harness.rows("SELECT business_no FROM orders")) == total
    elif policy == "reject":
        assert counts == {"202 enqueued": BOUND, "429 rejected": over}
        for answer in by_status["429 rejected"]:
            assert int(answer.headers["retry-after"]) > 0
            assert answer.json()["error"]["code"] == "queue_full"
        rejected = {a.json()["id"] for a in by_status["429 rejected"]}
        stored = {r.id: r.status.value for r in harness.records()}
        assert {stored[i] for i in rejected} == {"rejected"}
    else:
        assert counts == {"202 enqueued": BOUND, "200 done": over}
        ran = {a.json()["business_no"] for a in by_status["200 done"]}
        assert {row[0] for row in harness.rows("SELECT business_no FROM orders")} == ran
        assert rt.redis.llen("order") == BOUND


def queue_directly(rt, line: str, count: int) -> None:
    """Journal and push `count` records in batches, as a flood of accepted requests would."""
    for start in range(0, count, 500):
        now = utcnow()
        ids = []
        with rt.engine.begin() as conn:
            for n in range(start, min(start + 500, count)):
                rid = new_id(now)
                payload = {"business_no": f"F-{n}", "status": "s", "occurred_at": now.isoformat()}
                store.insert_record(
                    conn,
                    NewRecord(
                        id=rid,
                        line=line,
                        business_no=f"F-{n}",
                        source=Source.INTAKE,
                        dedup_key=f"flood:{rid}",
                        body_sha256="0" * 64,
                        payload=payload,
                    ),
                    now=now,
                )
                ids.append(rid)
        assert rt.pusher.push(line, ids, max_length=100_000).pushed == len(ids)


def post_orders_and_time(harness, client, prefix: str) -> float:
    started = time.monotonic()
    ids = {
        client.post("/v1/order", json={"business_no": f"{prefix}-{n}"}).json()["id"]
        for n in range(50)
    }
    final = harness.wait_until_final(ids, timeout_s=120)
    elapsed = time.monotonic() - started
    assert {r.status.value for r in final.values()} == {"done"}
    return elapsed


def test_a_flooded_status_line_does_not_starve_the_order_line(harness):
    harness.configure(lines__status__handler="tests.support.handlers:slow")
    client = harness.start_intake()
    rt = harness.runtime()
    harness.start_worker("order", pool="prefork", concurrency=2)
    alone_s = post_orders_and_time(harness, client, "ALONE")

    queue_directly(rt, "status", 5000)
    harness.start_worker("status", pool="prefork", concurrency=2)
    flooded_s = post_orders_and_time(harness, client, "FLOOD")

    backlog = rt.redis.llen("status")
    with rt.engine.connect() as conn:
        unfinished = store.find_records(
            conn, RecordFilter(line="status", statuses=[]), limit=10_000
        ).items
    not_done = sum(1 for r in unfinished if r.status.value != "done")
    assert backlog > 0
    assert not_done > 0  # the status backlog was still there when the orders were done
    print(
        f"\nisolation: 50 order records took {alone_s:.2f} s alone and {flooded_s:.2f} s "
        f"with {backlog} status messages still queued"
    )


def test_a_line_over_its_intake_rate_waits_its_turn_or_gets_429_and_other_lines_do_not(
    harness,
):
    # One status request a second, each waiting at most a second: of a burst of 12, two or
    # three go through (a few more if the burst spreads out) and the rest are refused at
    # once, journaling nothing.
    harness.configure(lines__status__intake_rate="1")
    client = harness.start_intake()
    answered: list[tuple[float, httpx.Response]] = []
    lock = threading.Lock()

    def post(line: str, n: int) -> None:
        body = {"business_no": f"{line}-{n}"}
        if line == "status":
            body |= {"status": "paid", "occurred_at": "2026-11-29T10:00:00Z"}
        with httpx.Client(base_url=str(client.base_url), timeout=30) as own:
            answer = own.post(f"/v1/{line}", json=body)
        with lock:
            answered.append((time.monotonic(), answer))

    flood_threads = [threading.Thread(target=post, args=("status", n)) for n in range(12)]
    for thread in flood_threads:
        thread.start()
    wait_for(lambda: len(answered) > 0, timeout_s=30, what="a first status answer")
    post("order", 0)  # while status requests still wait their turn
    for thread in flood_threads:
        thread.join(timeout=30)
    assert len(answered) == 13

    (order_at, order), *rest = [(t, a) for t, a in answered if a.url.path == "/v1/order"]
    assert not rest
    assert order.status_code == 202, order.text
    status = [(t, a) for t, a in answered if a.url.path == "/v1/status"]
    admitted = [(t, a) for t, a in status if a.status_code == 202]
    refused = [a for _, a in status if a.status_code != 202]
    assert 2 <= len(admitted) <= 6, [a.status_code for _, a in status]
    for answer in refused:
        assert answer.status_code == 429, answer.text
        assert answer.json()["error"]["code"] == "rate_limited"
        assert int(answer.headers["retry-after"]) >= 1
    # The order line is not paced: its request was answered while a status one still waited.
    assert any(at > order_at for at, _ in admitted)

    journaled = {r.id: r.line for r in harness.records()}
    assert sorted(journaled.values()) == ["order"] + ["status"] * len(admitted)
    assert {a.json()["id"] for _, a in admitted} | {order.json()["id"]} == set(journaled)
    # Counters reach /metrics with their process's next flush (about a second).
    intake = "pipeline_intake_requests_total"
    expected = {"rate_limited": len(refused), "accepted": len(admitted)}

    def counted() -> dict[str, float]:
        found = samples(client.get("/metrics").text)
        return {k: metric(found, intake, line="status", outcome=k) for k in expected}

    wait_for(lambda: counted() == expected, timeout_s=15, what=f"the counters at {expected}")
