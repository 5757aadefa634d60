"""The agent's per-request and per-batch series are kept as plain numbers: what a scrape reads
is what prometheus_client's own Counter and Histogram expose for the same observations."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.inference.stats import VersionStats
from agent.metrics import BATCH_BUCKETS, LATENCY_BUCKETS_S, AgentMetrics

HOT = {
    "edgefleet_requests",
    "edgefleet_inference_rows",
    "edgefleet_batch_executions",
    "edgefleet_batch_size_rows",
    "edgefleet_queue_seconds",
    "edgefleet_compute_seconds",
    "edgefleet_request_seconds",
}
# on a bound, just either side of one, past the last, zero
TIMES = (0.0, 0.0005, 0.00050001, 0.0049, 0.005, 0.3, 9.99, 10.0, 11.0, 123.0)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.name in HOT
        for s in family.samples
    }


def _reference() -> bytes:
    """The same observations through prometheus_client's Counter and Histogram."""
    r = CollectorRegistry()
    labels = ["model", "version"]
    requests = Counter("edgefleet_requests", "x", [*labels, "outcome"], registry=r)
    rows = Counter("edgefleet_inference_rows", "x", labels, registry=r)
    batches = Counter("edgefleet_batch_executions", "x", labels, registry=r)
    size = Histogram("edgefleet_batch_size_rows", "x", labels, buckets=BATCH_BUCKETS, registry=r)
    names = ("edgefleet_request_seconds", "edgefleet_queue_seconds", "edgefleet_compute_seconds")
    times = [Histogram(n, "x", labels, buckets=LATENCY_BUCKETS_S, registry=r) for n in names]
    for t in TIMES:
        requests.labels("m", "1", "success").inc()
        for i, histogram in enumerate(times):
            histogram.labels("m", "1").observe(t * (i + 1))
    requests.labels("m", "1", "deadline_exceeded").inc()
    requests.labels("m", "2", "invalid_input").inc()
    for n in (1, 2, 3, 256, 300):
        rows.labels("m", "1").inc(n)
        batches.labels("m", "1").inc()
        size.labels("m", "1").observe(n)
    rows.labels("m", "2")  # a version loaded, nothing run yet
    batches.labels("m", "2")
    size.labels("m", "2")
    return generate_latest(r)


def test_hot_series_expose_what_prometheus_client_would() -> None:
    metrics = AgentMetrics()
    for t in TIMES:
        metrics.observe_success("m", "1", t, 2 * t, 3 * t)
    metrics.observe_failure("m", "1", "deadline_exceeded")
    metrics.observe_failure("m", "2", "invalid_input")
    observe = metrics.batch_observer("m", "1", VersionStats())
    metrics.batch_observer("m", "2", VersionStats())
    for n in (1, 2, 3, 256, 300):
        observe(n, 0.01, 0.0, 0.0)
    ours = _samples(metrics.render().decode())
    expected = _samples(_reference().decode())
    assert ours == expected
    assert len(ours) == 82  # every bucket, count and sum of every series: not an empty match
    # and exactly where the buckets say: 0.0005 is in le=0.0005, 0.00050001 is not
    labels = (("le", "0.0005"), ("model", "m"), ("version", "1"))
    assert ours["edgefleet_request_seconds_bucket", labels] == 2
