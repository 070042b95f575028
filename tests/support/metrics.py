"""Reading the intake's `/metrics` in tests, with prometheus-client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of a Prometheus text, by name and sorted labels."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def metric(found: Samples, name: str, **labels: str) -> float:
    """One sample's value; fails the test when it is missing."""
    key = (name, tuple(sorted(labels.items())))
    assert key in found, f"{name}{labels} missing from /metrics"
    return found[key]
