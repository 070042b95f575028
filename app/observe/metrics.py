"""`GET /metrics`: the pipeline in Prometheus text, read at scrape time.

Queue depth and live workers come from Redis, counts by status and the oldest unfinished
record from the journal, counters from the hash every process adds to (`app.telemetry.counters`).
A part whose source does not answer is left out, and `pipeline_redis_up` or
`pipeline_journal_up` says so: a scrape never fails because a dependency did."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.delivery.circuit import State
from app.errors import BrokerUnavailable, JournalUnavailable
from app.journal.models import RecordStatus
from app.lines import LineRegistry
from app.observe.line_view import JournalView, LineView, QueueView
from app.telemetry.counters import Counter, IntakeOutcome, decode, read_counters

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_COUNTER_HELP: dict[Counter, tuple[str, tuple[str, ...]]] = {
    Counter.INTAKE: ("Intake answers to POST /v1/{line}, by outcome.", ("line", "outcome")),
    Counter.DONE: ("Records delivered (moved to done).", ("line",)),
    Counter.DEAD: ("Records declared dead after their last attempt.", ("line",)),
    Counter.FAILED: ("Attempts that failed and were scheduled again.", ("line",)),
    Counter.SWEEP_ENQUEUED: ("Records the sweeper put (back) on their queue.", ("line",)),
    Counter.SWEEP_RECOVERED: ("Records re-enqueued after Redis lost them.", ("line",)),
    Counter.ALERTS: ("Alerts raised (before throttling), by event.", ("event", "line")),
}


def _counter_families(lines: LineRegistry, values: dict[str, int]) -> list[Metric]:
    families = {
        counter: CounterMetricFamily(counter.value, text, labels=list(labels))
        for counter, (text, labels) in _COUNTER_HELP.items()
    }
    seen: dict[tuple[str, tuple[str, ...]], float] = {}
    for field, value in values.items():
        name, labels = decode(field)
        if name not in Counter.__members__.values():
            continue
        counter = Counter(name)
        keys = _COUNTER_HELP[counter][1]
        if set(labels) != set(keys):
            continue
        seen[(name, tuple(labels[k] for k in keys))] = float(value)
    # Every line's series exist from the start, at zero: a rate() needs no first event.
    for line in lines:
        for outcome in IntakeOutcome:
            seen.setdefault((Counter.INTAKE.value, (line.name, outcome.value)), 0)
        for counter in (
            Counter.DONE,
            Counter.DEAD,
            Counter.FAILED,
            Counter.SWEEP_ENQUEUED,
            Counter.SWEEP_RECOVERED,
        ):
            seen.setdefault((counter.value, (line.name,)), 0)
    for (name, label_values), total in sorted(seen.items()):
        families[Counter(name)].add_metric(list(label_values), total)
    return list(families.values())


def _queue_families(lines: LineRegistry, queues: dict[str, QueueView]) -> list[Metric]:
    depth = GaugeMetricFamily(
        "pipeline_queue_depth",
        "Records on the line's Redis queue, waiting or held by a worker until it acks (what "
        "the bound counts).",
        labels=["line"],
    )
    messages = GaugeMetricFamily(
        "pipeline_queue_messages", "Messages waiting on the line's Redis lists.", labels=["line"]
    )
    live = GaugeMetricFamily(
        "pipeline_live_workers", "Workers whose heartbeat for the line is live.", labels=["line"]
    )
    by_sender = GaugeMetricFamily(
        "pipeline_sender_queue_depth",
        "Records on the line's queue by sender (an intake key id): the ten with the most by "
        "name, the rest summed as `other`.",
        labels=["line", "sender"],
    )
    past_share = GaugeMetricFamily(
        "pipeline_sender_past_fair_share",
        "Of those, records waiting past the sender's fair share, behind every other sender's.",
        labels=["line", "sender"],
    )
    circuit = GaugeMetricFamily(
        "pipeline_circuit_open",
        "1 while the line's circuit is open: its downstream fails most deliveries, one probe "
        "goes at a time and records wait without spending attempts (HTTP-sink lines).",
        labels=["line"],
    )
    for line in lines:
        view = queues[line.name]
        depth.add_metric([line.name], view.depth)
        messages.add_metric([line.name], view.messages)
        live.add_metric([line.name], view.live_workers)
        for share in view.senders:
            by_sender.add_metric([line.name, share.sender], share.records)
            past_share.add_metric([line.name, share.sender], share.past_share)
        if view.circuit is not None:
            circuit.add_metric([line.name], 1 if view.circuit.state is State.OPEN else 0)
    return [depth, messages, live, by_sender, past_share, circuit]


def _journal_families(lines: LineRegistry, journal: JournalView, *, now: datetime) -> list[Metric]:
    by_status = GaugeMetricFamily(
        "pipeline_records", "Journal records by line and status.", labels=["line", "status"]
    )
    oldest = GaugeMetricFamily(
        "pipeline_oldest_unfinished_age_seconds",
        "Age of the line's oldest unfinished record (0 when none).",
        labels=["line"],
    )
    for line in lines:
        counts = journal.counts.get(line.name, {})
        for status in RecordStatus:
            by_status.add_metric([line.name, status.value], counts.get(status.value, 0))
        started = journal.oldest_unfinished.get(line.name)
        oldest.add_metric([line.name], (now - started).total_seconds() if started else 0.0)
    return [by_status, oldest]


def _paused_family(view: LineView) -> Metric:
    paused = GaugeMetricFamily(
        "pipeline_line_paused",
        "1 while an operator has the line paused (no attempt starts, nothing is pushed).",
        labels=["line"],
    )
    found = view.pauses()
    for line in view.lines:
        paused.add_metric([line.name], 1 if line.name in found else 0)
    return paused


def families(view: LineView, *, now: datetime) -> list[Metric]:
    """Every metric family of one scrape."""
    lines = view.lines
    bound = GaugeMetricFamily(
        "pipeline_queue_max_length", "The line's queue bound.", labels=["line", "overflow"]
    )
    for line in lines:
        bound.add_metric([line.name, line.settings.overflow.value], line.settings.max_queue_length)
    found: list[Metric] = [bound]
    redis_up = GaugeMetricFamily("pipeline_redis_up", "1 when Redis answered this scrape.")
    try:
        queues = view.queue_views()
        counters = read_counters(view.redis)
    except BrokerUnavailable:
        redis_up.add_metric([], 0)
    else:
        redis_up.add_metric([], 1)
        found += _queue_families(lines, queues) + _counter_families(lines, counters)
    journal_up = GaugeMetricFamily("pipeline_journal_up", "1 when the journal answered.")
    try:
        journal = view.journal_view()
    except JournalUnavailable:
        journal_up.add_metric([], 0)
    else:
        journal_up.add_metric([], 1)
        found += [*_journal_families(lines, journal, now=now), _paused_family(view)]
    return [*found, redis_up, journal_up]


class _Scrape(Collector):
    def __init__(self, found: list[Metric]) -> None:
        self._found = found

    def collect(self) -> Iterable[Metric]:
        return self._found


def render(view: LineView, *, now: datetime) -> bytes:
    """The Prometheus text of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Scrape(families(view, now=now)))
    return generate_latest(registry)
