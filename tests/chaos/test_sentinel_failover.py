"""Redis behind Sentinel, its primary killed (-9) under load on every line: Sentinel promotes
the replica, and the intake, the workers (kombu's Sentinel transport) and the beat follow it.
The replica lagged on purpose (its link stopped shortly before the kill), so the failover
loses the messages pushed meanwhile; the lost-message check pushes them again. Every
accepted record ends done, none is lost, and no record runs twice at once."""

from __future__ import annotations

import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import redis

from app.admission.push import Pusher
from app.config.redis import make_redis
from app.journal.models import RecordStatus
from app.wiring.runtime import Runtime
from beat.lock import BeatLock
from tests.support.harness import Harness
from tests.support.processes import wait_for
from tests.support.runs import overlapping, runs_by_record, use_runs_log
from tests.support.sentinel import SentinelSet

pytestmark = [pytest.mark.timeout(240), pytest.mark.loads_machine]

LINES = ("order", "refund", "status")
TOTAL = 600
CLIENTS = 8
# Each run of an order or refund takes this long: the workers (2 per line) fall behind the
# clients, so messages wait on the queues when the primary dies.
RUN_S = 0.2
# The partial-loss rule: a lost message is back on its queue within this.
BACK_WITHIN_S = 30
# Records accepted when replication stops.
LAG_AT = 200
# How long the primary takes writes the replica never gets: shorter than Sentinel's
# down-after time, so the stopped replica is never judged down and stays electable.
LAG_S = 0.7


def _post(client: httpx.Client, line: str, body: dict[str, object]) -> str:
    """Post until answered 2xx, with the same nonce on every try; returns the record id."""
    headers = {"x-nonce": uuid.uuid4().hex}
    deadline = time.monotonic() + 60
    while True:
        try:
            response = client.post(f"/v1/{line}", json=body, headers=headers)
            if response.status_code in (200, 202):
                record_id: str = response.json()["id"]
                return record_id
            assert response.status_code == 503, response.text
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"no 2xx for {line} {body} within 60 s"
        time.sleep(0.2)


def _load(base_url: str, accepted: list[str]) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)

    def produce(client_no: int) -> None:
        with httpx.Client(base_url=base_url, timeout=30) as client:
            for n in range(client_no, TOTAL, CLIENTS):
                line = LINES[n % 3]
                body: dict[str, object] = {"business_no": f"{line[0].upper()}-{n}"}
                if line == "status":
                    body |= {"status": f"st-{n}", "occurred_at": (start + timedelta(seconds=n))}
                    body["occurred_at"] = str(body["occurred_at"])
                else:
                    body["sleep_s"] = RUN_S
                accepted.append(_post(client, line, body))

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(produce, range(CLIENTS)))


def _waiting_but_gone(rt: Runtime, harness: Harness) -> set[str]:
    """Records whose message should wait in Redis (enqueued in its epoch, not yet run) and
    is neither on its queue nor held by a worker. Read journal, Redis, journal: a record a
    worker took meanwhile has left `enqueued` by the second read."""

    def enqueued() -> set[str]:
        epoch = rt.pusher.epoch()
        return {
            r.id
            for r in harness.records()
            if r.status is RecordStatus.ENQUEUED and r.queue_epoch == epoch and r.attempts == 0
        }

    before = enqueued()
    present: set[str] = set()
    for line in LINES:
        present |= rt.pusher.ledger.scan(rt.lines.get(line).queue).ids
    return (before & enqueued()) - present


def _all_back(rt: Runtime, harness: Harness, lost: set[str]) -> bool:
    """Every record of `lost` is back on its queue, held by a worker, or run."""
    present: set[str] = set()
    for line in LINES:
        present |= rt.pusher.ledger.scan(rt.lines.get(line).queue).ids
    now = {r.id: r for r in harness.records() if r.id in lost}
    return all(
        i in present or now[i].status is not RecordStatus.ENQUEUED or now[i].attempts > 0
        for i in lost
    )


def test_primary_killed_under_load_sentinel_promotes_and_nothing_is_lost(harness, tmp_path):
    cluster = SentinelSet(tmp_path / "sentinel")
    try:
        cluster.start()
        log = use_runs_log(harness, tmp_path)
        harness.configure(
            redis_url=cluster.url,
            lines__refund__handler="tests.support.handlers:logged_run",
            # Longer than the promotion takes: the test sees what the failover lost before the
            # lost-message check pushes it again.
            lost_after_seconds="6",
            lost_check_interval_seconds="2",
            visibility_timeout_seconds="20",
        )
        client = harness.start_intake()
        workers = [
            harness.start_worker(line, pool="prefork", concurrency=2, wait=False) for line in LINES
        ]
        beat = harness.start_beat(wait=False)
        for worker in workers:
            worker.wait_for_output(" ready.", timeout_s=60)
        beat.wait_for_output("beat: Starting", timeout_s=60)
        rt = harness.runtime()

        accepted: list[str] = []
        times: dict[str, float] = {}
        lost: set[str] = set()
        errors: list[BaseException] = []

        def fault() -> None:
            try:
                wait_for(lambda: len(accepted) >= LAG_AT, timeout_s=60, what="load")
                cluster.lag()
                time.sleep(LAG_S)  # part of the fault: the writes the replica will lack
                times["killed"] = time.monotonic()
                cluster.kill_primary()
                times["promoted"] = cluster.wait_for_promotion(timeout_s=30)
                # At once: the lost-message check pushes them again within seconds.
                lost.update(_waiting_but_gone(rt, harness))
                left_s = BACK_WITHIN_S - (time.monotonic() - times["promoted"])
                wait_for(
                    lambda: _all_back(rt, harness, lost),
                    timeout_s=max(0.05, left_s),
                    what="the lost messages to be back",
                )
                times["back"] = time.monotonic()
            except BaseException as exc:  # noqa: BLE001 - reported to the test below
                errors.append(exc)

        faulting = threading.Thread(target=fault)
        faulting.start()
        _load(client.base_url.__str__().rstrip("/"), accepted)
        faulting.join(timeout=120)
        assert not errors, errors
        assert "promoted" in times, "Sentinel promoted no replica"
        assert lost, "the failover lost no message: the test tested nothing"

        final = harness.wait_until_final(set(accepted), timeout_s=120)
        all_done_s = time.monotonic() - times["killed"]
        assert {r.status for r in final.values()} == {RecordStatus.DONE}
        assert len(final) == len(set(accepted)) == TOTAL

        runs = runs_by_record(log)
        assert overlapping(runs) == {}
        ran = {r.id for r in final.values() if r.line in ("order", "refund")}
        assert set(runs) == ran, "a record of a logged line never ran"
        repeated = {i: spans for i, spans in runs.items() if len(spans) > 1}
        checks = [
            int(n) for n in re.findall(r"lost_messages_pushed_again.*?pushed=(\d+)", beat.output())
        ]
        recovered = sum(checks)
        back_s = times["back"] - times["promoted"]
        print(
            f"\nsentinel failover: posted={TOTAL} accepted={len(accepted)} "
            f"lost_by_failover={len(lost)} recovered={recovered} back_within_s={back_s:.1f} "
            f"promotion_s={times['promoted'] - times['killed']:.1f} "
            f"all_done_s={all_done_s:.1f} run_twice_not_at_once={len(repeated)}"
        )
        assert recovered >= len(lost)
    finally:
        harness.close()  # the processes first, then their Redis
        cluster.stop()


def test_our_clients_follow_a_failover_and_the_beat_lock_stays_single(tmp_path):
    """The push's Lua script and the beat lock's, over a sentinel URL. The lock is taken
    after replication stopped, so the promoted replica never gets it: the standby beat
    takes it there, and counts on it only one TTL later, when the old holder, still
    counting on its last renewal meanwhile, has stopped. The same client objects reach the
    promoted replica, which has no script loaded, and each call succeeds there."""
    cluster = SentinelSet(tmp_path / "sentinel")
    client = None
    clock_s = [100.0]
    try:
        cluster.start()
        client = make_redis(cluster.url)
        pusher = Pusher(client)
        active, standby = (BeatLock(client, ttl_s=10, clock=lambda: clock_s[0]) for _ in "ab")
        assert pusher.push("order", ["r-1"], max_length=10).pushed == 1
        wait_for(lambda: cluster.replica_has(b"order"), timeout_s=10, what="replication")
        cluster.lag()
        assert active.hold() == (True, None)  # the replica never gets this write
        assert standby.hold() == (False, None)

        cluster.kill_primary()
        cluster.wait_for_promotion(timeout_s=30)
        replica = redis.Redis(port=cluster.replica_port)
        replica.script_flush()  # whatever it may have kept, it now has no script
        replica.close()
        # The first command after the kill may still meet the dead primary: redis-py's retry
        # asks the sentinels again.
        wait_for(lambda: _answers(client), timeout_s=15, what="the client to reach the new primary")
        port = client.connection_pool.get_master_address()[1]  # type: ignore[attr-defined]
        assert port == cluster.replica_port

        clock_s[0] = 103.0
        assert standby.hold()[0]  # the key is gone: the standby takes it...
        assert active.active_since() is not None  # ...while the holder counts on it still,
        assert standby.active_since() is None  # so the standby waits
        assert active.hold() == (False, None)  # told at its next renewal
        assert active.active_since() is None
        clock_s[0] = 113.0  # one TTL after the standby took the lock
        assert standby.hold() == (True, None)
        assert standby.active_since() is not None

        assert pusher.push("order", ["r-2"], max_length=10).pushed == 1
        assert pusher.ledger.scan("order").ids == {"r-1", "r-2"}
    finally:
        if client is not None:
            client.close()
        cluster.stop()


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
