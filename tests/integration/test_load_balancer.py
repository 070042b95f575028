"""Two `pipeline intake` processes behind a real HTTP load balancer (Debian's haproxy,
round-robin), sharing one journal and one Redis: a line's bound holds across both under
32 producers, and a signed request sent again, through whichever intake, is one record."""

from __future__ import annotations

import contextlib
import json
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.integration.test_overload import DepthSampler
from tests.support.haproxy import LoadBalancer, haproxy_binary
from tests.support.harness import Harness, signed_headers
from tests.support.messages import queued_ids
from tests.support.processes import TLS_CONTEXT, Component, free_port, wait_for

KEY_ID, SECRET = "shop-1", "s3cret-value-of-shop-1"
ADMIN_TOKEN = "admin-token-0123456789"
PRODUCERS = 32
BOUND = 50
RECORDS = 400
# Distinct signed requests, each sent this many times at once through the balancer.
REQUESTS, SENDS_EACH = 8, 8


def _listening(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2, verify=TLS_CONTEXT).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def intakes_behind_haproxy(
    harness: Harness, tmp_path: Path
) -> Iterator[tuple[LoadBalancer, list[Component]]]:
    """Two `pipeline intake` processes on free ports, the same settings (keys, admin token,
    journal, Redis), and haproxy round-robin in front of them."""
    haproxy_binary()  # skips (fails in CI) before anything starts when there is none
    harness.configure(
        intake_keys=json.dumps({KEY_ID: SECRET}), admin_token=ADMIN_TOKEN, log_json="true"
    )
    ports = [free_port(), free_port()]
    intakes = [harness.run("intake", "--port", str(port)) for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    for url in urls:
        wait_for(lambda url=url: _listening(url), timeout_s=40, what=f"the intake at {url}")
    balancer = LoadBalancer(urls, workdir=tmp_path / "haproxy")
    try:
        yield balancer.start(), intakes
    finally:
        balancer.stop()


def _post(client: httpx.Client, line: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return client.post(f"/v1/{line}", content=body, headers=headers)


def _received_by(intake: Component) -> int:
    """How many new records an intake process journaled, from its own log lines."""
    total = 0
    for text in intake.output().splitlines():
        with contextlib.suppress(ValueError):
            line = json.loads(text)
            if isinstance(line, dict) and line.get("event") == "records_received":
                total += int(line["count"])
    return total


# What each policy answers past the bound, and the status the journal keeps it in.
OVER_BOUND = {"reject": (429, "rejected"), "defer": (202, "deferred")}


@pytest.mark.journal
@pytest.mark.parametrize("policy", sorted(OVER_BOUND))
def test_the_bound_holds_across_two_intakes_behind_a_load_balancer(harness, tmp_path, policy):
    harness.configure(
        lines__order__max_queue_length=str(BOUND),
        lines__order__sender_queue_share="1",
        lines__order__overflow=policy,
        lines__order__batch_size="1",  # one record to a message: the bound counts records
    )
    bodies = [json.dumps({"business_no": f"LB-{n}"}).encode() for n in range(RECORDS)]

    def produce(worker: int) -> list[httpx.Response]:
        with httpx.Client(base_url=balancer.url, timeout=60) as client:
            return [
                _post(client, "order", bodies[n], signed_headers(KEY_ID, SECRET, bodies[n]))
                for n in range(worker, RECORDS, PRODUCERS)
            ]

    with intakes_behind_haproxy(harness, tmp_path) as (balancer, intakes):
        rt = harness.runtime()
        before = balancer.answered()
        with DepthSampler(rt.redis, "order") as sampler, ThreadPoolExecutor(PRODUCERS) as pool:
            answers = [a for batch in pool.map(produce, range(PRODUCERS)) for a in batch]
        after = balancer.answered()
        received = [_received_by(intake) for intake in intakes]

    by_answer: dict[tuple[int, str], set[str]] = {}
    for answer in answers:
        by_answer.setdefault((answer.status_code, answer.json()["status"]), set()).add(
            answer.json()["id"]
        )
    counts = {key: len(ids) for key, ids in by_answer.items()}
    print(f"\nanswers {counts}; through each intake {after}; journaled by each {received}")
    over = OVER_BOUND[policy]
    assert counts == {(202, "enqueued"): BOUND, over: RECORDS - BOUND}
    assert len(sampler.samples) > 100
    assert max(sampler.samples) <= BOUND
    assert rt.redis.llen("order") == BOUND
    # Every answer names its own record, and the journal holds each as it was answered:
    # on the queue, or past the bound kept as deferred (the sweeper pushes it as room
    # appears) or as rejected (for a resend or a replay): none is lost.
    stored = {record.id: record.status.value for record in harness.records()}
    assert len(stored) == RECORDS
    assert {stored[i] for i in by_answer[(202, "enqueued")]} == {"enqueued"}
    assert {stored[i] for i in by_answer[over]} == {over[1]}
    # The balancer spread the producers over both intakes, and both journaled records.
    spread = {name: after[name] - before[name] for name in after}
    assert sum(spread.values()) == RECORDS
    assert min(spread.values()) >= RECORDS // 4, spread
    assert sum(received) == RECORDS
    assert min(received) > 0, received


@pytest.mark.journal
def test_a_signed_request_sent_again_through_either_intake_is_one_record(harness, tmp_path):
    """Each of several signed requests sent many times at once, as clients that retry do,
    reaches both intakes: each is one record, every answer names it (one 202, the others
    200), and its nonce with another body is refused with 409 by either intake."""
    bodies = [json.dumps({"business_no": f"DUP-{n}"}).encode() for n in range(REQUESTS)]
    headers = [
        signed_headers(KEY_ID, SECRET, body, nonce=f"retried-{n}") for n, body in enumerate(bodies)
    ]
    sends = [n for n in range(REQUESTS) for _ in range(SENDS_EACH)]
    random.Random(23).shuffle(sends)
    start = threading.Barrier(PRODUCERS)

    def produce(worker: int) -> list[tuple[int, httpx.Response]]:
        mine = sends[worker::PRODUCERS]
        with httpx.Client(base_url=balancer.url, timeout=60) as client:
            start.wait(timeout=30)
            return [(n, _post(client, "order", bodies[n], headers[n])) for n in mine]

    with intakes_behind_haproxy(harness, tmp_path) as (balancer, _intakes):
        before = balancer.answered()
        with ThreadPoolExecutor(PRODUCERS) as pool:
            answers = [a for batch in pool.map(produce, range(PRODUCERS)) for a in batch]
        after_sends = balancer.answered()
        other_body = json.dumps({"business_no": "DUP-0", "amount": 1}).encode()
        other = signed_headers(KEY_ID, SECRET, other_body, nonce="retried-0")
        with httpx.Client(base_url=balancer.url, timeout=30) as client:
            conflicts = [_post(client, "order", other_body, other) for _ in range(4)]
            # The balancer's client address says nothing: an unsigned request is refused,
            # whatever X-Forwarded-For claims.
            spoofed = client.post(
                "/v1/order",
                content=bodies[0],
                headers={"content-type": "application/json", "x-forwarded-for": "127.0.0.1"},
            )
            after_conflicts = balancer.answered()
            # The admin token is the same on both: each lists the same records.
            admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
            listed = [
                client.get("/v1/records", params={"line": "order"}, headers=admin) for _ in range(2)
            ]
        after_listing = balancer.answered()

    unanswered = [(n, a.status_code, a.text) for n, a in answers if a.status_code not in (200, 202)]
    assert unanswered == []
    for n in range(REQUESTS):
        mine = [a for m, a in answers if m == n]
        assert sorted(a.status_code for a in mine) == [200] * (SENDS_EACH - 1) + [202]
        assert len({a.json()["id"] for a in mine}) == 1, [a.json() for a in mine]
    # A send that reaches the other intake while the record is committed but not yet
    # marked `enqueued` (the intake that made it marks it after its push and its answer)
    # is told `received`: its status in the journal then.
    statuses = {a.json()["status"] for _, a in answers}
    print(f"\nstatuses answered: {sorted(statuses)}")
    assert statuses <= {"enqueued", "received"}
    ids = {a.json()["id"] for _, a in answers}
    assert len(ids) == REQUESTS
    # Each record is on the queue once: no intake pushed a record the other had made.
    assert sorted(queued_ids(harness.runtime().redis, "order")) == sorted(ids)

    def all_enqueued() -> bool:
        return {(r.id, r.status.value) for r in harness.records()} == {(i, "enqueued") for i in ids}

    wait_for(all_enqueued, timeout_s=10, what="every record marked enqueued")
    assert [(a.status_code, a.json()["error"]["code"]) for a in conflicts] == [
        (409, "nonce_reused")
    ] * 4
    assert spoofed.status_code == 401
    assert [sorted(r["id"] for r in a.json()["items"]) for a in listed] == [sorted(ids)] * 2
    assert harness.record_count() == REQUESTS
    # Both intakes took the repeated sends, both refused the other body (two of the five
    # refusals at least, one of which may be the unsigned one), and both listed.
    sent = {name: after_sends[name] - before[name] for name in before}
    refused = {name: after_conflicts[name] - after_sends[name] for name in before}
    lists = {name: after_listing[name] - after_conflicts[name] for name in before}
    print(f"\nthrough each intake: sends {sent}, refusals {refused}, listings {lists}")
    assert sum(sent.values()) == REQUESTS * SENDS_EACH
    assert min(sent.values()) >= REQUESTS * SENDS_EACH // 4, sent
    assert min(refused.values()) >= 2, refused
    assert lists == dict.fromkeys(before, 1)
