"""Under sustained overload, deferred records are not overtaken by newer ones."""

from __future__ import annotations

import time

from tests.support.messages import take_and_ack
from tests.support.runs import runs_by_record, use_runs_log

BOUND = 5
POSTS = 90
# A post every 25 ms (40/s) against a worker that takes 40 ms a record (25/s at best): the
# queue stays full for the whole flood.
POST_EVERY_S = 0.025
RUN_S = "0.04"


def test_a_steady_flood_delivers_in_journal_order(harness, tmp_path):
    log = use_runs_log(harness, tmp_path)
    harness.configure(
        lines__order__max_queue_length=str(BOUND),
        lines__order__overflow="defer",
        lines__order__batch_size="1",
        # The sweeper drains what waits after the flood at the bound per pass.
        sweep_interval_seconds="0.2",
    )
    client = harness.start_intake()
    harness.start_worker("order")
    harness.start_beat()
    posted: list[str] = []
    statuses: dict[str, str] = {}
    next_at = time.monotonic()
    for n in range(POSTS):
        answer = client.post("/v1/order", json={"business_no": f"F-{n}", "sleep_s": RUN_S})
        assert answer.status_code == 202, answer.text
        posted.append(answer.json()["id"])
        statuses[answer.json()["id"]] = answer.json()["status"]
        next_at += POST_EVERY_S
        time.sleep(max(0.0, next_at - time.monotonic()))
    assert sum(status == "deferred" for status in statuses.values()) > POSTS // 3
    final = harness.wait_until_final(set(posted), timeout_s=90)
    assert {r.status.value for r in final.values()} == {"done"}

    runs = runs_by_record(log)
    started = sorted(posted, key=lambda record_id: runs[record_id][0][0])
    position = {record_id: n for n, record_id in enumerate(posted)}
    # Each record posted while older ones waited in the journal starts after all of them.
    overtaken = [
        record_id
        for n, record_id in enumerate(started)
        if any(position[later] > position[record_id] for later in started[:n])
    ]
    assert overtaken == [], (
        f"{len(overtaken)} of {POSTS} records were overtaken by newer ones; "
        f"start order by post position: {[position[r] for r in started]}"
    )


def test_new_records_wait_behind_records_left_in_the_journal_until_a_pass_settles(harness):
    rt = harness.runtime()
    pusher, waiting = rt.pusher, rt.pusher.waiting
    # A push that leaves records for the journal keeps later ones behind them.
    first = pusher.push("q", ["a", "b", "c"], max_length=2, keeps_left=True)
    assert (first.pushed, first.behind) == (2, False)
    assert first.leaving is not None
    take_and_ack(rt.redis, "q")  # a worker took one: there is room again
    waiting_push = pusher.push("q", ["d"], max_length=2, behind=True, keeps_left=True)
    assert (waiting_push.pushed, waiting_push.behind, waiting_push.depth) == (0, True, 1)
    # A push that does not wait (the sweeper's, a reject line's) still has the room.
    assert pusher.push("q", ["c"], max_length=2).pushed == 1
    # A pass that found nothing left does not free new records while a move of records
    # left out is not yet committed.
    mark = waiting.mark("q")
    assert waiting.settle("q", mark=mark) is False
    waiting.left_kept("q", first.leaving)
    waiting.left_kept("q", waiting_push.leaving)
    # Records the bound left out since the pass began keep new ones behind as well.
    full = pusher.push("q", ["e"], max_length=2, keeps_left=True)
    waiting.left_kept("q", full.leaving)
    assert waiting.settle("q", mark=mark) is False
    assert pusher.push("q", ["f"], max_length=3, behind=True).behind is True
    # New records deferred behind others (not by the bound) do not keep the line behind.
    mark = waiting.mark("q")
    behind = pusher.push("q", ["g"], max_length=3, behind=True, keeps_left=True)
    waiting.left_kept("q", behind.leaving)
    assert waiting.settle("q", mark=mark) is True
    freed = pusher.push("q", ["h"], max_length=3, behind=True)
    assert (freed.pushed, freed.behind) == (1, False)


def test_one_pass_at_a_time_claims_a_line(harness):
    waiting = harness.runtime().pusher.waiting
    with waiting.one_pass("q") as first:
        assert first is True
        started = time.monotonic()
        with waiting.one_pass("q") as second:
            assert second is False
        assert time.monotonic() - started >= 1.0  # it waited for the first before leaving
        with waiting.one_pass("other") as other:
            assert other is True
    with waiting.one_pass("q") as again:
        assert again is True
