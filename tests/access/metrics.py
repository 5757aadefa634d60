"""Reading counters out of a Prometheus exposition."""

from __future__ import annotations

from collections import Counter

from prometheus_client.parser import text_string_to_metric_families


def counts(exposition: str, name: str) -> Counter[tuple[str, str]]:
    """``{(topic, code): value}`` of a rejection counter (labels topic and code)."""
    out: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name:
                out[(sample.labels["topic"], sample.labels["code"])] += int(sample.value)
    return out


def value(exposition: str, name: str) -> float:
    """The value of an unlabelled series (0 when absent)."""
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return 0.0
