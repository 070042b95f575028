"""Fair shares within a line: a sender past its line's `fair_share` waits behind every
sender within theirs, and a sender's own records still leave in the order it sent them."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest

from app.admission.ledger import Ledger, held_key, records_key
from app.admission.senders import low_queue, sender_shares
from app.clock import utcnow
from app.journal.models import RecordStatus
from app.wiring.runtime import Runtime
from tests.support.downstream import Gauged
from tests.support.harness import Harness, signed_headers
from tests.support.journal import new_record
from tests.support.messages import queued_ids, take_and_ack
from tests.support.metrics import metric, samples

# Runs on every journal database (SQLite and PostgreSQL): a sweeper pass picks records by
# sender in SQL.
pytestmark = pytest.mark.journal

SHARE = 10
SECRET = "s" * 32


def accept(rt: Runtime, sender: str, count: int, prefix: str) -> list[str]:
    """`count` records of `order` from `sender`, committed and pushed in one group, one to
    a message; their ids, oldest first."""
    news = [new_record("order", f"{prefix}-{n}", now=utcnow(), sender=sender) for n in range(count)]
    rt.acceptor.accept_many(news, clock=utcnow)
    return [new.id for new in news]


def parted(harness: Harness, **more: str) -> Runtime:
    """`order` bounded at 50 records, 30 of them for any one sender, one to a message."""
    harness.configure(
        lines__order__max_queue_length="50",
        lines__order__sender_queue_share="0.6",
        lines__order__batch_size="1",
        **more,
    )
    return harness.runtime()


@pytest.fixture
def rt(harness: Harness) -> Runtime:
    harness.configure(lines__order__fair_share=str(SHARE), lines__order__batch_size="1")
    return harness.runtime()


def test_a_flooding_senders_records_wait_behind_a_sender_within_its_share(rt: Runtime) -> None:
    flood = accept(rt, "shop-a", 50, "A")
    late = accept(rt, "shop-b", 3, "B")

    # What the workers take next: the flood's share, the other sender's records, then the
    # rest of the flood, in the order it came.
    assert queued_ids(rt.redis, "order") == flood[:SHARE] + late + flood[SHARE:]
    assert rt.redis.llen(low_queue("order")) == 40
    shares = {s.sender: s for s in sender_shares(rt.redis, "order")}
    assert (shares["shop-a"].records, shares["shop-a"].past_share) == (50, 40)
    assert (shares["shop-b"].records, shares["shop-b"].past_share) == (3, 0)
    # The bound still counts every record of the line once.
    assert rt.pusher.depth("order") == 53


def test_a_sender_back_within_its_share_stays_behind_its_own_records_until_they_leave(
    rt: Runtime,
) -> None:
    first = accept(rt, "shop-a", SHARE + 5, "A")
    # The workers take and ack the share: 5 of the sender's records are left, all past it.
    for _ in range(SHARE):
        take_and_ack(rt.redis, "order")
    assert queued_ids(rt.redis, "order") == first[SHARE:]

    # Within its share again, but its records past it have not left: the new one waits
    # behind them (its business number's records stay in the order they came).
    second = accept(rt, "shop-a", 1, "A2")
    assert rt.redis.llen(low_queue("order")) == 6
    assert queued_ids(rt.redis, "order") == first[SHARE:] + second

    # Once they have all left, the sender's next record is taken ahead again.
    while take_and_ack(rt.redis, "order") is not None:
        pass
    assert sender_shares(rt.redis, "order") == []
    flood = accept(rt, "shop-c", 30, "C")
    third = accept(rt, "shop-a", 1, "A3")
    assert queued_ids(rt.redis, "order") == flood[:SHARE] + third + flood[SHARE:]


def test_a_lost_message_is_taken_out_of_its_senders_counts_by_the_scan(rt: Runtime) -> None:
    accept(rt, "shop-a", SHARE + 2, "A")
    # Both lists emptied by hand: the messages are gone, their counts are not yet.
    rt.redis.delete("order", low_queue("order"))
    time.sleep(0.01)  # the scan begins in a later millisecond than the push
    ledger = Ledger(rt.redis)
    seen = ledger.scan("order")
    assert seen.ids == set()
    # A scan forgets only messages pushed before it began.
    assert ledger.forget_unseen("order", seen) == SHARE + 2
    assert sender_shares(rt.redis, "order") == []
    assert rt.pusher.depth("order") == 0


def test_sender_counts_an_older_workers_ack_left_wrong_are_rebuilt(rt: Runtime) -> None:
    accept(rt, "shop-a", SHARE + 5, "A")
    ledger = Ledger(rt.redis)
    assert ledger.recount_senders("order") is False  # right: nothing to do
    # An ack as a worker of the version before sender counts makes it: the message and
    # the line's count go, its sender's count stays.
    raw = rt.redis.rpop("order")
    assert isinstance(raw, bytes)
    tag = json.loads(raw)["properties"]["delivery_tag"]
    rt.redis.hdel(held_key("order"), tag)
    rt.redis.decrby(records_key("order"), 1)
    assert sender_shares(rt.redis, "order")[0].records == SHARE + 5

    assert ledger.recount_senders("order") is True
    (share,) = sender_shares(rt.redis, "order")
    assert (share.records, share.past_share) == (SHARE + 4, 5)
    assert ledger.recount_senders("order") is False


def test_the_senders_named_are_the_busiest_and_the_rest_are_summed(rt: Runtime) -> None:
    for n in range(12):
        accept(rt, f"shop-{n:02}", n + 1, f"S{n}")
    shares = sender_shares(rt.redis, "order", top=3)
    assert [(s.sender, s.records) for s in shares] == [
        ("shop-11", 12),
        ("shop-10", 11),
        ("shop-09", 10),
        ("other", sum(range(1, 10))),
    ]
    assert shares[0].past_share == 12 - SHARE


def test_lines_metrics_and_status_show_each_senders_records_and_what_waits_past_its_share(
    harness: Harness, rt: Runtime
) -> None:
    accept(rt, "shop-a", SHARE + 30, "A")
    accept(rt, "shop-b", 2, "B")
    client = harness.start_intake()

    order = next(
        line for line in client.get("/v1/lines").json()["lines"] if line["line"] == "order"
    )
    assert order["fair_share"] == SHARE
    assert order["senders"] == [
        {"sender": "shop-a", "records": SHARE + 30, "past_fair_share": 30},
        {"sender": "shop-b", "records": 2, "past_fair_share": 0},
    ]
    # Every message waiting, on both of the queue's lists.
    assert order["queue_messages"] == SHARE + 32

    found = samples(client.get("/metrics").text)
    assert metric(found, "pipeline_sender_queue_depth", line="order", sender="shop-a") == SHARE + 30
    assert metric(found, "pipeline_sender_past_fair_share", line="order", sender="shop-a") == 30
    assert metric(found, "pipeline_sender_queue_depth", line="order", sender="shop-b") == 2

    harness.env["COLUMNS"] = "300"  # one table row per line, however narrow the terminal
    status = harness.run("status")
    assert status.process is not None
    assert status.process.wait(timeout=30) == 0, status.output()
    assert f"shop-a={SHARE + 30} (30), shop-b=2" in status.output()


def test_a_sender_past_its_part_of_the_bound_defers_its_own_records_and_not_the_others(
    harness: Harness,
) -> None:
    rt = parted(harness, lines__order__fair_share=str(SHARE))
    flood = accept(rt, "shop-a", 45, "A")
    late = accept(rt, "shop-b", 5, "B")

    statuses = harness.statuses()
    assert [statuses[i] for i in flood] == ["enqueued"] * 30 + ["deferred"] * 15
    # The line has room: the other sender's records go on the queue.
    assert [statuses[i] for i in late] == ["enqueued"] * 5
    assert rt.pusher.depth("order") == 35

    # Workers take ten of shop A's: it is under its part again, but its new record waits
    # behind its own deferred ones (its order), while shop B's still go on.
    for _ in range(SHARE):
        take_and_ack(rt.redis, "order")
    (again,) = accept(rt, "shop-a", 1, "A-again")
    (other,) = accept(rt, "shop-b", 1, "B-again")
    statuses = harness.statuses()
    assert (statuses[again], statuses[other]) == ("deferred", "enqueued")

    # A pass pushes shop A's deferred records, oldest (by id) first, up to its part.
    deferred = sorted(flood[30:])
    rt.sweeper.drain("order", now=utcnow())
    assert queued_ids(rt.redis, "order")[-10:] == deferred[:10]
    assert {harness.statuses()[i] for i in deferred[10:]} == {"deferred"}

    # Once every record waiting in the journal is on the queue, shop A's new records go
    # straight on again.
    while take_and_ack(rt.redis, "order") is not None:
        pass
    rt.sweeper.drain("order", now=utcnow())
    assert queued_ids(rt.redis, "order") == [*deferred[10:], again]
    rt.sweeper.drain("order", now=utcnow())  # finds nothing waiting: frees new records
    (last,) = accept(rt, "shop-a", 1, "A-last")
    assert harness.statuses()[last] == "enqueued"

    # The overflow was loud: a QUEUE_FULL naming the sender, though the queue had room.
    assert rt.alerts.flush(timeout_s=5)
    client = harness.start_intake()
    (full,) = [a for a in client.get("/v1/alerts").json()["alerts"] if a["event"] == "QUEUE_FULL"]
    assert "'shop-a'" in full["message"]
    assert full["figures"]["senders"] == "shop-a"
    assert full["figures"]["sender_limit"] == 30


def test_a_pass_pushes_other_senders_waiting_records_past_a_sender_at_its_part(
    harness: Harness,
) -> None:
    rt = parted(harness)
    # 30 on the queue, 30 deferred: at its part, with more deferred than the line has room
    # (20), so that a pass claiming the oldest first would claim only shop A's.
    flood = accept(rt, "shop-a", 60, "A")
    # Shop B's records, journaled after shop A's and not pushed (Redis did not answer,
    # say): `received`, for the sweeper once the grace period is over.
    news = [new_record("order", f"B-{n}", now=utcnow(), sender="shop-b") for n in range(3)]
    rt.acceptor.journal_many(news, clock=utcnow)
    time.sleep(1.5)  # past the harness's grace period (1 s), on the database's clock

    rt.sweeper.sweep(now=utcnow())

    statuses = harness.statuses()
    assert [statuses[new.id] for new in news] == ["enqueued"] * 3
    assert queued_ids(rt.redis, "order")[-3:] == sorted(new.id for new in news)
    # Shop A's, older, were not even claimed: its part has no room.
    assert {statuses[i] for i in flood[30:]} == {"deferred"}
    assert rt.pusher.depth("order") == 33


def test_a_sender_at_its_part_keeps_neither_the_line_nor_itself_behind_for_nothing(
    harness: Harness,
) -> None:
    rt = parted(harness)
    waiting = rt.pusher.waiting
    flood = accept(rt, "shop-a", 60, "A")  # 30 on the queue, 30 deferred: at its part
    waiting.keep_behind("order")  # as a resume does: the line's new records wait
    rt.sweeper.drain("order", now=utcnow())
    # Nothing of the other senders waits: the line's new records are free again, though
    # shop A's deferred records still wait for room in its part.
    (other,) = accept(rt, "shop-b", 1, "B")
    assert harness.statuses()[other] == "enqueued"
    assert set(waiting.mark("order").senders) == {"shop-a"}

    # Workers free room for exactly what shop A has deferred: a pass pushes all of it,
    # finds nothing of shop A's left though its part is full again, and frees it.
    for _ in range(30):
        take_and_ack(rt.redis, "order")
    rt.sweeper.drain("order", now=utcnow())
    assert {harness.statuses()[i] for i in flood} == {"enqueued"}
    assert waiting.mark("order").senders == {}
    take_and_ack(rt.redis, "order")  # shop B's
    take_and_ack(rt.redis, "order")  # one of shop A's: room for one more in its part
    (again,) = accept(rt, "shop-a", 1, "A-again")  # pushed at once, not behind itself
    assert harness.statuses()[again] == "enqueued"


FLOOD = 5_000
LATE = 50


def post_signed(client: httpx.Client, key_id: str, business_no: str) -> str:
    """One order record signed by `key_id`; its id."""
    body = json.dumps({"business_no": business_no}).encode()
    answer = client.post("/v1/order", content=body, headers=signed_headers(key_id, SECRET, body))
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


@pytest.mark.journal_independent
@pytest.mark.loads_machine
def test_a_senders_records_are_all_done_while_another_senders_flood_mostly_waits(
    harness: Harness,
) -> None:
    """Shop A posts 5,000 orders at once, then shop B posts 50, one every 100 ms, to the
    same line with one worker: all of B's are done while more than half of A's wait."""
    downstream = Gauged(delay_s=0.1).start()
    try:
        harness.configure(
            intake_keys=json.dumps({"shop-a": SECRET, "shop-b": SECRET}),
            lines__order__downstream_url=f"{downstream.url}/in",
            # About 40 deliveries a second: A's flood takes minutes.
            lines__order__deliveries_in_flight="4",
        )
        client = harness.start_intake()
        harness.start_worker("order", pool=None, concurrency=None)
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            flood = set(pool.map(lambda n: post_signed(client, "shop-a", f"A-{n}"), range(FLOOD)))
        late = set()
        for n in range(LATE):
            late.add(post_signed(client, "shop-b", f"B-{n}"))
            time.sleep(0.1)
        harness.wait_until_final(late, timeout_s=60)
        statuses = harness.statuses()
        assert {statuses[i] for i in late} == {RecordStatus.DONE.value}
        flood_done = sum(1 for i in flood if statuses[i] == RecordStatus.DONE.value)
        assert flood_done < FLOOD / 2, f"{flood_done} of A's {FLOOD} records were done first"
    finally:
        downstream.stop()
