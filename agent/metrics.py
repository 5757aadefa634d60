"""Prometheus metrics of the agent, on a registry of its own (no global state).

Per request and per batch the hot path only adds to plain numbers bound once per version
(:class:`Tally`, :class:`Spread`), exposed at scrape time; everything that is a state (queue
depth, memory, readiness, CPU, RSS, accelerators, cost) is read at scrape time too.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator
from enum import StrEnum
from typing import TYPE_CHECKING

import psutil
from prometheus_client import CollectorRegistry, Counter, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from agent.accelerators import AcceleratorProbe

if TYPE_CHECKING:  # what the agent serves reports here; metrics import none of it to run
    from agent.inference.batcher import BatchObserver
    from agent.inference.manager import ModelManager
    from agent.inference.stats import VersionStats

LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)
LABELS = ("model", "version")


class RefusalReason(StrEnum):
    """Why a request was turned away: the ``reason`` of ``edgefleet_requests_refused_total``.
    A limit's refusal is named after its setting."""

    BAD_HTTP = "bad_http"
    """400: not HTTP the agent serves (unparsable, an upgrade, a body cut short)."""
    MAX_HEADER_BYTES = "max_header_bytes"
    """431."""
    HEADER_TIMEOUT = "header_timeout"
    """408: the head was not complete within ``header_timeout_s``."""
    BODY_TIMEOUT = "body_timeout"
    """408: the body was not complete within ``body_timeout_s``."""
    MAX_CONNECTIONS = "max_connections"
    """503."""
    MAX_CONCURRENT_REQUESTS = "max_concurrent_requests"
    """503."""
    MAX_INFLIGHT_BODY_BYTES = "max_inflight_body_bytes"
    """503: the bodies in flight would pass the budget (413 for a body over it alone)."""
    MAX_REQUEST_BYTES = "max_request_bytes"
    """413: declared, streamed or inflated past it."""
    UNAUTHORIZED = "unauthorized"
    """401: no API key, or not a valid one."""
    RATE_LIMITED = "rate_limited"
    """429."""
    BAD_JSON = "bad_json"
    """400: an inference body that is not JSON."""
    NULL_VALUE = "null_value"
    """400: null where a tensor's value belongs (a client's NaN, often)."""
    INVALID_REQUEST = "invalid_request"
    """400: any other malformed request (shape, datatype, parameters, the tensor limits)."""
    MODEL_NOT_FOUND = "model_not_found"
    """404."""
    MODEL_NOT_READY = "model_not_ready"
    """503: the model is known but not serving."""
    QUEUE_FULL = "queue_full"
    """503: the model's batcher queue is full (``max_queue_size``)."""
    SHUTTING_DOWN = "shutting_down"
    """503: a new request while the agent shuts down."""


class Tally:
    """A counter of one label set, kept as a plain number."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Spread:
    """A histogram of one label set, kept as plain numbers: the count in each bucket (the last
    one ``+Inf``) and the sum. A value lands in the first bucket whose bound is not below it,
    as in prometheus_client."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value


class _Counters:
    """A counter by label values, exposed at scrape time.

    prometheus_client's ``Counter.inc`` and ``Histogram.observe`` take a lock for every value
    they change and find a histogram's bucket in a Python loop: the four calls of every request
    (the outcome, and its latency, queue and compute times) and the three of every batch were 5
    % of the event loop's Python at ``mlp``, JSON, concurrency 32 (cProfile, 2026-12-04). The
    event loop's thread is the only one to change these series (here and in :class:`_Spreads`),
    so they take no lock; a scrape runs on the loop too.
    """

    def __init__(self, name: str, doc: str, labels: tuple[str, ...]) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.series: dict[tuple[str, ...], Tally] = {}

    def child(self, *values: str) -> Tally:
        return self.series.setdefault(values, Tally())

    def family(self) -> Metric:
        counter = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for values, tally in self.series.items():
            counter.add_metric(values, tally.value)
        return counter


class _Spreads:
    """A histogram by label values, exposed at scrape time (see :class:`_Counters`)."""

    def __init__(
        self, name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]
    ) -> None:
        self.name, self.doc, self.labels, self.buckets = name, doc, labels, buckets
        self.series: dict[tuple[str, ...], Spread] = {}

    def child(self, *values: str) -> Spread:
        return self.series.setdefault(values, Spread(self.buckets))

    def family(self) -> Metric:
        histogram = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for values, spread in self.series.items():
            cumulative, buckets = 0, []
            for bound, count in zip((*self.buckets, float("inf")), spread.counts, strict=True):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))  # type: ignore[no-untyped-call]
            histogram.add_metric(values, buckets, spread.total)
        return histogram


class AgentMetrics:
    def __init__(
        self, *, hourly_cost: float | None = None, accelerators: AcceleratorProbe | None = None
    ) -> None:
        # The *_created series double the exposition for no use on a device.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = _Counters(
            "edgefleet_requests",
            "Inference requests by outcome (success or error code)",
            (*LABELS, "outcome"),
        )
        self.rows = _Counters("edgefleet_inference_rows", "Rows inferred (inference count)", LABELS)
        self.batches = _Counters(
            "edgefleet_batch_executions", "Batches run (execution count)", LABELS
        )
        self.batch_size = _Spreads(
            "edgefleet_batch_size_rows", "Rows per executed batch", LABELS, BATCH_BUCKETS
        )
        self.queue = _Spreads(
            "edgefleet_queue_seconds", "Time requests waited for a batch", LABELS, LATENCY_BUCKETS_S
        )
        self.compute = _Spreads(
            "edgefleet_compute_seconds",
            "Runtime time of the batch a request ran in",
            LABELS,
            LATENCY_BUCKETS_S,
        )
        self.latency = _Spreads(
            "edgefleet_request_seconds",
            "End-to-end time of successful requests",
            LABELS,
            LATENCY_BUCKETS_S,
        )
        self.pipeline_steps = _Spreads(
            "edgefleet_pipeline_step_seconds",
            "Time of each step of a pipeline's successful requests",
            (*LABELS, "step"),
            LATENCY_BUCKETS_S,
        )
        self.refusals = _Counters(
            "edgefleet_requests_refused",
            "Requests turned away before any inference ran, by reason",
            ("reason",),
        )
        for reason in RefusalReason:  # every reason from the start, at 0
            self.refusals.child(reason.value)
        self.fleet_rejected = Counter(
            "edgefleet_fleet_messages_rejected",
            "Fleet messages refused, by topic and reason",
            ["topic", "code"],
            registry=r,
        )
        self.payload_dropped = Counter(
            "edgefleet_payload_records_dropped",
            "Payload log records dropped: a full queue or a failing sink",
            registry=r,
        )
        # prometheus_client's locked counters: the capture writer thread changes these
        self.capture_samples = Counter(
            "edgefleet_capture_samples",
            "Samples captured into the spool, by model and trigger",
            ["model", "trigger"],
            registry=r,
        )
        self.capture_dropped = Counter(
            "edgefleet_capture_dropped",
            "Samples the capture policy chose and did not keep, by model and reason",
            ["model", "reason"],
            registry=r,
        )
        self.capture_uploaded = Counter(
            "edgefleet_capture_uploaded",
            "Captured samples the control plane acknowledged, by model",
            ["model"],
            registry=r,
        )
        self._hourly_cost = hourly_cost
        self._accelerators = accelerators
        self._started = time.monotonic()
        self._manager: ModelManager | None = None
        self._total_rows = 0
        self._success: dict[tuple[str, str], tuple[Tally, Spread, Spread, Spread]] = {}
        self._process = psutil.Process()
        r.register(_StateCollector(self))

    def bind(self, manager: ModelManager) -> None:
        self._manager = manager

    def batch_observer(self, model: str, version: str, stats: VersionStats) -> BatchObserver:
        rows_c, batches_c, size_h = (
            self.rows.child(model, version),
            self.batches.child(model, version),
            self.batch_size.child(model, version),
        )

        def observe(rows: int, compute_s: float, input_s: float, output_s: float) -> None:
            self._total_rows += rows
            stats.record_batch(rows, compute_s, input_s, output_s)
            rows_c.inc(rows)
            batches_c.inc()
            size_h.observe(rows)

        return observe

    def observe_success(
        self, model: str, version: str, total_s: float, queue_s: float, compute_s: float
    ) -> None:
        children = self._success.get((model, version))
        if children is None:  # looked up once per version
            children = self._success[model, version] = (
                self.requests.child(model, version, "success"),
                self.latency.child(model, version),
                self.queue.child(model, version),
                self.compute.child(model, version),
            )
        requests, latency, queue, compute = children
        requests.inc()
        latency.observe(total_s)
        queue.observe(queue_s)
        compute.observe(compute_s)

    def observe_steps(self, model: str, version: str, timings: list[tuple[str, float]]) -> None:
        """The steps of one successful pipeline request."""
        for step, seconds in timings:
            self.pipeline_steps.child(model, version, step).observe(seconds)

    def observe_failure(self, model: str, version: str, code: str) -> None:
        self.requests.child(model, version, code).inc()

    def count_refusal(self, reason: RefusalReason) -> None:
        """One request turned away; called on the event loop, as the hot path's counters are."""
        self.refusals.series[(reason.value,)].inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect_state(self) -> Iterator[Metric]:
        for hot in (
            self.requests,
            self.refusals,
            self.rows,
            self.batches,
            self.batch_size,
            self.queue,
            self.compute,
            self.latency,
            self.pipeline_steps,
        ):
            yield hot.family()
        depth = GaugeMetricFamily(
            "edgefleet_queue_depth", "Requests waiting in the batcher", labels=LABELS
        )
        pending = GaugeMetricFamily(
            "edgefleet_pending_requests", "Requests accepted and not yet answered", labels=LABELS
        )
        ready = GaugeMetricFamily(
            "edgefleet_model_ready", "1 if the version serves requests", labels=LABELS
        )
        load = GaugeMetricFamily(
            "edgefleet_model_load_seconds", "Time to load and warm the version", labels=LABELS
        )
        memory = GaugeMetricFamily(
            "edgefleet_model_memory_bytes", "Memory accounted to the version", labels=LABELS
        )
        reruns = CounterMetricFamily(
            "edgefleet_batch_reruns",
            "Batches that failed on one request's data and were run again one request at a "
            "time (their executions count in edgefleet_batch_executions and their rows in "
            "edgefleet_inference_rows again)",
            labels=LABELS,
        )
        if self._manager is not None:
            for entry in self._manager.models.values():
                for version, lv in entry.served.items():
                    labels = [entry.name, str(version)]
                    depth.add_metric(labels, lv.batcher.pending)
                    pending.add_metric(labels, lv.inflight)
                    ready.add_metric(labels, 1)
                    load.add_metric(labels, lv.load_s)
                    memory.add_metric(labels, lv.memory_bytes)
                    reruns.add_metric(labels, lv.batcher.rerun_batches)
        yield from (depth, pending, ready, load, memory, reruns)
        with self._process.oneshot():
            cpu = self._process.cpu_times()
            rss = self._process.memory_info().rss
        yield CounterMetricFamily(
            "process_cpu_seconds", "CPU time of the agent process", value=cpu.user + cpu.system
        )
        yield GaugeMetricFamily(
            "process_resident_memory_bytes", "Resident memory of the agent process", value=rss
        )
        if self._accelerators is not None:
            util = self._accelerators.utilisation()
            if util:
                family = GaugeMetricFamily(
                    "edgefleet_accelerator_utilization_ratio",
                    "Accelerator busy share (0-1)",
                    labels=["device"],
                )
                for device, ratio in sorted(util.items()):
                    family.add_metric([device], ratio)
                yield family
        if self._hourly_cost is not None and self._total_rows:
            hours = (time.monotonic() - self._started) / 3600
            yield GaugeMetricFamily(
                "edgefleet_cost_per_1k_predictions",
                "Device cost per thousand rows inferred since start "
                "(device_hourly_cost x uptime / rows)",
                value=self._hourly_cost * hours / self._total_rows * 1000,
            )

    @property
    def hourly_cost(self) -> float | None:
        """The device's cost per hour (``device_hourly_cost``), None when not set."""
        return self._hourly_cost


class _StateCollector(Collector):
    def __init__(self, metrics: AgentMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.collect_state()
