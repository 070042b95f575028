"""What every process of the pipeline reports for the operator's view: counters (intake
outcomes, records done and dead, sweeper re-enqueues, alerts raised) and the last point
events among the alerts (the incidents are kept by `app.telemetry.incidents`).

Each process adds to local counts, which one background thread folds into Redis every
second (`HINCRBY` on one hash, pipelined), so `/metrics` on any intake sums every process
on every host. Outcomes (done, failed, dead) also go into per-minute buckets per line
(`app.telemetry.throughput`), in the minute they were counted. Counting never blocks or
fails the caller: while Redis is away the counts wait in memory and go with the next
flush."""

from __future__ import annotations

import json
import threading
from collections import Counter as Tally
from collections import deque
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Any

import redis

from app.clock import utcnow
from app.config.redis import as_text
from app.errors import BrokerUnavailable
from app.telemetry import throughput
from app.telemetry.logs import get_logger
from app.threads import LoopThread

log = get_logger(__name__)

COUNTERS_KEY = "pipeline:metrics"
ALERTS_KEY = "pipeline:alerts:recent"
# How many alerts the status page can show.
RECENT_ALERTS = 50
FLUSH_INTERVAL_S = 1.0
# Label values are line names, event names and the fixed outcomes below: never these.
_FIELD_SEPARATOR = "|"


class Counter(StrEnum):
    """The pipeline's counters, as Prometheus names them (without `_total`)."""

    INTAKE = "pipeline_intake_requests"
    DONE = "pipeline_records_done"
    DEAD = "pipeline_records_dead"
    FAILED = "pipeline_attempts_failed"
    SWEEP_ENQUEUED = "pipeline_sweeper_enqueued"
    SWEEP_RECOVERED = "pipeline_sweeper_recovered"
    ALERTS = "pipeline_alerts"


class IntakeOutcome(StrEnum):
    """How the intake answered a `POST /v1/{line}`."""

    ACCEPTED = "accepted"  # journaled and on the queue
    RECEIVED = "received"  # journaled; Redis did not answer, the sweeper pushes it
    DEFERRED = "deferred"
    REJECTED = "rejected"
    CALLER_RUN = "caller_run"
    DUPLICATE = "duplicate"  # a replayed request: the original record, nothing new
    INVALID = "invalid"  # 400, 404, 413, 422
    UNAUTHORIZED = "unauthorized"  # 401
    CONFLICT = "conflict"  # 409: a nonce reused with another body
    UNAVAILABLE = "unavailable"  # 503
    RATE_LIMITED = "rate_limited"  # 429 before the journal: over the line's intake rate


# The counters that are also counted per minute, and as what.
_PER_MINUTE = {
    Counter.DONE: throughput.Outcome.DONE,
    Counter.FAILED: throughput.Outcome.FAILED,
    Counter.DEAD: throughput.Outcome.FAILED,
}


def encode(counter: Counter, labels: dict[str, str]) -> str:
    """The hash field of one counter series: `name|key=value|...`, keys sorted."""
    return _FIELD_SEPARATOR.join([counter.value, *(f"{k}={labels[k]}" for k in sorted(labels))])


def decode(field: str) -> tuple[str, dict[str, str]]:
    """The counter name and labels of a hash field written by `encode`."""
    name, *pairs = field.split(_FIELD_SEPARATOR)
    labels = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
    return name, labels


class Telemetry:
    """One process's counts and alerts on their way to Redis."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        interval_s: float = FLUSH_INTERVAL_S,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._client = client
        self._clock = clock
        self._counts: Tally[str] = Tally()
        # (bucket key, field) -> amount: the per-minute outcomes not yet in Redis.
        self._minutes: Tally[tuple[str, str]] = Tally()
        self._alerts: deque[str] = deque(maxlen=RECENT_ALERTS)
        self._lock = threading.Lock()
        # Started on first use; its first flush one interval later, its last on `close`.
        self._loop = LoopThread(
            self._flush_step,
            name="telemetry",
            every_s=interval_s,
            final_step=True,
            delay_first=True,
        )

    @property
    def client(self) -> redis.Redis:
        """The Redis this process reports to."""
        return self._client

    def count(self, counter: Counter, amount: int = 1, **labels: str) -> None:
        """Add `amount` to one series. Never raises, never waits on Redis."""
        if amount <= 0:
            return
        outcome = _PER_MINUTE.get(counter)
        line = labels.get("line")
        with self._lock:
            self._counts[encode(counter, labels)] += amount
            if outcome is not None and line:
                minute_s = throughput.minute_of(self._clock())
                self._minutes[throughput.bucket_key(line, minute_s), outcome.value] += amount
        self._loop.start()

    def note_alert(self, alert: dict[str, Any]) -> None:
        """Keep the point event `alert` (id, event, line, time, count, message, details) for
        the console."""
        with self._lock:
            self._alerts.append(json.dumps(alert, default=str))
        self._loop.start()

    def flush(self) -> bool:
        """Send what is pending; True when Redis took it (else it stays pending)."""
        with self._lock:
            counts, self._counts = self._counts, Tally()
            minutes, self._minutes = self._minutes, Tally()
            alerts = list(self._alerts)
            self._alerts.clear()
        if not counts and not alerts:
            return True
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for field, amount in counts.items():
                    pipe.hincrby(COUNTERS_KEY, field, amount)
                for (key, field), amount in minutes.items():
                    pipe.hincrby(key, field, amount)
                    pipe.expire(key, throughput.KEEP_S)
                if alerts:
                    pipe.lpush(ALERTS_KEY, *alerts)
                    pipe.ltrim(ALERTS_KEY, 0, RECENT_ALERTS - 1)
                pipe.execute()
        except redis.RedisError as exc:
            with self._lock:
                self._counts.update(counts)
                self._minutes.update(minutes)
                self._alerts.extendleft(reversed(alerts))
            log.debug("telemetry_flush_failed", error=type(exc).__name__)
            return False
        return True

    def _flush_step(self) -> None:
        self.flush()

    def close(self, *, timeout_s: float = 2.0) -> None:
        """Flush what is pending (once, within `timeout_s`) and stop the thread."""
        self._loop.stop(timeout_s=timeout_s)


def read_counters(client: redis.Redis) -> dict[str, int]:
    """Every counter series, summed over all processes. Raises `BrokerUnavailable`."""
    try:
        raw = client.hgetall(COUNTERS_KEY)
    except redis.RedisError as exc:
        raise BrokerUnavailable(f"counters unavailable: {exc}") from exc
    return {as_text(key): int(value) for key, value in raw.items()}


def recent_alerts(client: redis.Redis, *, limit: int = RECENT_ALERTS) -> list[dict[str, Any]]:
    """The newest alerts first. Raises `BrokerUnavailable`."""
    try:
        raw = client.lrange(ALERTS_KEY, 0, limit - 1)
    except redis.RedisError as exc:
        raise BrokerUnavailable(f"alerts unavailable: {exc}") from exc
    alerts = []
    for item in raw:
        try:
            alerts.append(json.loads(item))
        except ValueError:
            continue
    return alerts
