"""Prometheus metrics of the agent, on a registry of its own (no global state).

Per request and per batch the hot path only touches pre-bound children; everything that is a
state (queue depth, memory, readiness, CPU, RSS, accelerators, cost) is read at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import psutil
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agent.accelerators import AcceleratorProbe
from agent.inference.batcher import BatchObserver
from agent.inference.stats import VersionStats

if TYPE_CHECKING:
    from agent.inference.manager import ModelManager

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
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LABELS = ("model", "version")


class AgentMetrics:
    def __init__(
        self, *, hourly_cost: float | None = None, accelerators: AcceleratorProbe | None = None
    ) -> None:
        # The *_created series double the exposition for no use on a device.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "edgefleet_requests",
            "Inference requests by outcome (success or error code)",
            [*LABELS, "outcome"],
            registry=r,
        )
        self.rows = Counter(
            "edgefleet_inference_rows", "Rows inferred (inference count)", LABELS, registry=r
        )
        self.batches = Counter(
            "edgefleet_batch_executions", "Batches run (execution count)", LABELS, registry=r
        )
        self.batch_size = Histogram(
            "edgefleet_batch_size_rows",
            "Rows per executed batch",
            LABELS,
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "edgefleet_queue_seconds",
            "Time requests waited for a batch",
            LABELS,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.compute = Histogram(
            "edgefleet_compute_seconds",
            "Runtime time of the batch a request ran in",
            LABELS,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.latency = Histogram(
            "edgefleet_request_seconds",
            "End-to-end time of successful requests",
            LABELS,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.fleet_rejected = Counter(
            "edgefleet_fleet_messages_rejected",
            "Fleet messages refused, by topic and reason",
            ["topic", "code"],
            registry=r,
        )
        self._hourly_cost = hourly_cost
        self._accelerators = accelerators
        self._started = time.monotonic()
        self._manager: ModelManager | None = None
        self._total_rows = 0
        self._success: dict[tuple[str, str], tuple[Counter, Histogram, Histogram, Histogram]] = {}
        self._process = psutil.Process()
        r.register(_StateCollector(self))

    def bind(self, manager: ModelManager) -> None:
        self._manager = manager

    def batch_observer(self, model: str, version: str, stats: VersionStats) -> BatchObserver:
        rows_c, batches_c, size_h = (
            self.rows.labels(model, version),
            self.batches.labels(model, version),
            self.batch_size.labels(model, version),
        )

        def observe(rows: int, compute_s: float) -> None:
            self._total_rows += rows
            stats.record_batch(rows, compute_s)
            rows_c.inc(rows)
            batches_c.inc()
            size_h.observe(rows)

        return observe

    def observe_success(
        self, model: str, version: str, total_s: float, queue_s: float, compute_s: float
    ) -> None:
        children = self._success.get((model, version))
        if children is None:  # labels() costs a lock and a tuple per call: once per version
            children = self._success[model, version] = (
                self.requests.labels(model, version, "success"),
                self.latency.labels(model, version),
                self.queue.labels(model, version),
                self.compute.labels(model, version),
            )
        requests, latency, queue, compute = children
        requests.inc()
        latency.observe(total_s)
        queue.observe(queue_s)
        compute.observe(compute_s)

    def observe_failure(self, model: str, version: str, code: str) -> None:
        self.requests.labels(model, version, code).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect_state(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
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
        if self._manager is not None:
            for entry in self._manager.models.values():
                for version, lv in entry.served.items():
                    labels = [entry.name, str(version)]
                    depth.add_metric(labels, lv.batcher.pending)
                    pending.add_metric(labels, lv.inflight)
                    ready.add_metric(labels, 1)
                    load.add_metric(labels, lv.load_s)
                    memory.add_metric(labels, lv.memory_bytes)
        yield from (depth, pending, ready, load, memory)
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


class _StateCollector(Collector):
    def __init__(self, metrics: AgentMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        return self._metrics.collect_state()
