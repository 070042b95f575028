"""A message never outlives kombu's visibility timeout, however slow the downstream.

An HTTP-sink line's worker takes as many messages as it keeps deliveries in flight, and a
message's records wait for the process's delivery slots. Toward a slow downstream a message
of many records may then run longer than `PIPELINE_VISIBILITY_TIMEOUT_SECONDS`, and kombu
restores it while it runs: a copy goes back on the line's list under the same delivery
tag, the first of the two to be acked takes their records out of the line's count, and the
other stays in Redis uncounted, so the sweeper fills the queue past its bound, and the copy
may run again. Measured here with everything real: a backlog of a paused line, resumed
toward a downstream that takes a while to answer each record, one worker with the line's
defaults, beat's sweeper, and a thread that reads the line's Redis keys every few
milliseconds for the whole run."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
import redis

from app.admission.ledger import UNACKED_KEY
from app.admission.senders import low_queue
from tests.support.downstream import Gauged, post_records
from tests.support.harness import Harness

# What it checks is the engine's and Redis's, not the journal's database: the SQLite pass only.
pytestmark = pytest.mark.journal_independent

LINE = "shipment"
# Short, so that a message of the run can outlive it: kombu restores a worker's unacked
# message once it is this old (its sweep runs every quarter of it, `app.celery_app`); an
# attempt's lease is 95 % of it, and a record waits for a delivery slot a quarter of that
# at most (`app.config.line_settings.limit_wait_s`: 2.4 s).
VISIBILITY_S = 10
# Within the lease with the wait for room (2.4 + 5 + 1 < 9.5 s), and well past DELAY_S.
DELIVERY_TIMEOUT_S = 5
# Each answer of the downstream takes this long: a slot comes free about this often, well
# within the 2.4 s a record waits for one, so a message's records keep waiting for slots
# (rather than being given back) for as long as the message has records left.
DELAY_S = 1.0
# The worker's delivery slots; with the line's defaults, as many threads, so as many
# messages at once.
SLOTS = 3
# Records a message carries: a message that waits for a slot for each of them, with about
# one slot of its own, runs about BATCH * DELAY_S (16 s), past the visibility timeout.
BATCH = 16
# Two and a half messages: the queue holds two full ones and a part, so the messages a
# worker runs do not all end together.
BOUND = 40
RECORDS = 80  # 27 s of the downstream's time at SLOTS answers at once
# How often the watch reads the line's keys.
SAMPLE_EVERY_S = 0.005


@dataclass(frozen=True)
class Message:
    """One message of the line found in Redis: its delivery tag, its records, where it
    was (`queue`, `low` or `unacked`), and whether kombu restored it (kombu marks the
    copy it puts back `redelivered`)."""

    tag: str
    records: int
    where: str
    redelivered: bool


def _parse(payload: dict[str, object], where: str) -> Message:
    body = payload.get("body")
    properties = payload.get("properties")
    headers = payload.get("headers")
    args = json.loads(base64.b64decode(str(body)))[0][0] if body else []
    records = 1 if isinstance(args, str) else len(args)
    tag = str(properties.get("delivery_tag")) if isinstance(properties, dict) else "?"
    info = properties.get("delivery_info") if isinstance(properties, dict) else None
    redelivered = bool(
        (isinstance(headers, dict) and headers.get("redelivered"))
        or (isinstance(info, dict) and info.get("redelivered"))
    )
    return Message(tag=tag, records=records, where=where, redelivered=redelivered)


@dataclass
class Watch:
    """Reads `queue`'s lists and kombu's unacked hash in one MULTI every SAMPLE_EVERY_S,
    on a thread of its own, until stopped: the most records found there at once (and what
    held them), and every message kombu put back after a worker had taken it."""

    client: redis.Redis
    queue: str
    samples: int = 0
    peak: int = 0
    peak_at_s: float = 0.0
    peak_held: list[Message] = field(default_factory=list)
    # Delivery tag -> when (s into the watch) it was first seen back after a take.
    restored: dict[str, float] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    _parsed: dict[bytes, Message | None] = field(default_factory=dict)
    _stopped: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _began: float = 0.0

    def __enter__(self) -> Watch:
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _listed(self, raw: bytes, where: str) -> Message | None:
        key = where.encode() + b"\0" + raw
        if key not in self._parsed:
            self._parsed[key] = _parse(json.loads(raw), where)
        return self._parsed[key]

    def _unacked(self, raw: bytes) -> Message | None:
        key = b"unacked\0" + raw
        if key not in self._parsed:
            payload, _exchange, routing_key = json.loads(raw)
            ours = routing_key == self.queue and isinstance(payload, dict)
            self._parsed[key] = _parse(payload, "unacked") if ours else None
        return self._parsed[key]

    def _run(self) -> None:
        while not self._stopped.wait(SAMPLE_EVERY_S):
            try:
                self._sample()
            except (redis.RedisError, ValueError, TypeError, KeyError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _sample(self) -> None:
        with self.client.pipeline(transaction=True) as pipe:
            pipe.lrange(self.queue, 0, -1)
            pipe.lrange(low_queue(self.queue), 0, -1)
            pipe.hvals(UNACKED_KEY)
            waiting, low, unacked = pipe.execute()
        held = [self._listed(raw, "queue") for raw in waiting]
        held += [self._listed(raw, "low") for raw in low]
        held += [self._unacked(raw) for raw in unacked]
        found = [message for message in held if message is not None]
        now_s = time.monotonic() - self._began
        for message in found:
            if message.where == "unacked":
                self.taken.add(message.tag)
            back = message.where != "unacked" and message.tag in self.taken
            if (back or message.redelivered) and message.tag not in self.restored:
                self.restored[message.tag] = now_s
        self.samples += 1
        records = sum(message.records for message in found)
        if records > self.peak:
            self.peak, self.peak_at_s, self.peak_held = records, now_s, found

    def describe_peak(self) -> str:
        by_where = Counter(m.where for m in self.peak_held)
        restored = sum(m.records for m in self.peak_held if m.tag in self.restored)
        return (
            f"{self.peak} records at {self.peak_at_s:.1f} s into the run, in "
            f"{len(self.peak_held)} messages ({dict(by_where)}), {restored} of them in "
            f"messages kombu had restored"
        )


def test_a_slow_downstream_keeps_the_bound_and_no_message_is_restored_while_it_runs(
    harness: Harness,
) -> None:
    downstream = Gauged(delay_s=DELAY_S).start()
    try:
        harness.configure(
            visibility_timeout_seconds=str(VISIBILITY_S),
            lines__shipment__downstream_url=f"{downstream.url}/in",
            lines__shipment__delivery_timeout_s=str(DELIVERY_TIMEOUT_S),
            lines__shipment__deliveries_in_flight=str(SLOTS),
            lines__shipment__batch_size=str(BATCH),
            lines__shipment__max_queue_length=str(BOUND),
            # One sender (dev mode's) may take the whole bound.
            lines__shipment__sender_queue_share="1",
        )
        client = harness.start_intake()
        # The backlog waits in the journal while the line is paused, and the sweeper pushes
        # it in full batches once it is resumed (posted one by one to a running line, each
        # record would go alone in a message of its own).
        paused = client.post(f"/v1/lines/{LINE}/pause")
        assert paused.status_code == 200, paused.text
        ids = post_records(client, LINE, RECORDS, "LONG")
        assert {harness.statuses()[i] for i in ids} == {"deferred"}
        worker = harness.start_worker(LINE, pool=None, concurrency=None)  # the line's defaults
        harness.start_beat()  # its sweeper pushes the backlog as room appears
        rt = harness.runtime()
        not_final: AssertionError | None = None
        with Watch(rt.redis, LINE) as watch:
            resumed = client.post(f"/v1/lines/{LINE}/resume")
            assert resumed.status_code == 200, resumed.text
            try:
                final = harness.wait_until_final(ids, timeout_s=75)
            except AssertionError as exc:  # the watch's findings say more: they go first
                not_final = exc
        assert not watch.errors, watch.errors[:5]
        assert watch.samples > 0
        assert worker.process is not None
        assert worker.process.poll() is None, "the worker died"

        # 1. The line's records in Redis, waiting or held by the worker, never passed the
        # bound.
        peak, restored = watch.peak, watch.restored
        assert peak <= BOUND, (
            f"the line's lists and kombu's unacked hash held {watch.describe_peak()}; the "
            f"bound is {BOUND} ({watch.samples} samples)"
        )
        # 2. kombu restored no message: none came back on the line's lists (nor was taken
        # again, marked `redelivered`) after the worker had taken it. Nothing else puts a
        # taken message back here: the worker lives all along and the journal answers (a
        # requeue for want of it would log `journal_unavailable_requeued`).
        assert not restored, (
            f"kombu restored {len(restored)} of the {len(watch.taken)} messages the worker "
            f"took while it ran them (past the {VISIBILITY_S} s visibility timeout), the "
            f"first {min(restored.values()):.1f} s into the run; journal_unavailable_requeued "
            f"in the worker's log: {'journal_unavailable_requeued' in worker.output()}"
        )
        # 3. Every record delivered, once.
        if not_final is not None:
            raise not_final
        assert {record.status.value for record in final.values()} == {"done"}
        keys = Counter(r.headers.get("Idempotency-Key") for r in downstream.snapshot())
        assert set(keys) == ids
        twice = {key: n for key, n in keys.items() if n > 1}
        assert not twice, f"{len(twice)} records were delivered more than once: {twice}"
    finally:
        downstream.stop()
