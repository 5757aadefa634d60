"""The periodic telemetry message: per-model counts and latency over the last window, and
device CPU, memory, temperature and accelerator use where readable.

Every version that served requests in a window is in that window's message, the ones taken out
of service in it too (replaced, rolled back, unloaded): the manager tells the collector at the
switch, and the collector goes on reading a version that left, requests that were in flight at
the switch included, until it is closed and its final counts are sent. Counts are differences
between readings of one loaded version's cumulative statistics, and latencies are taken by the
time they were recorded, so no request is counted in two windows or in none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psutil

from agent.accelerators import AcceleratorProbe
from agent.fleet.token_telemetry import TokenWindows
from agent.inference.manager import ModelManager
from agent.inference.sketches import InputSketchBook
from agent.inference.stats import VersionStats, percentiles_of
from agent.inference.versions import LoadedVersion
from common.protocol.messages import DeviceTelemetry, ModelTelemetry

if TYPE_CHECKING:
    from agent.generative.models import GenerativeModels

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class _Snapshot:
    requests: int = 0
    errors: int = 0
    rows: int = 0
    batches: int = 0
    busy_s: float = 0.0

    @classmethod
    def of(cls, s: VersionStats, instances: int) -> _Snapshot:
        """``s`` read now; busy time as the device's share: over the version's instances, each
        holding that share of its CPUs (or of its accelerator)."""
        requests = s.success.count + s.fail.count
        busy_s = s.busy_ns / 1e9 / max(1, instances)
        return cls(requests, s.model_errors(), s.inference_count, s.execution_count, busy_s)

    def __sub__(self, other: _Snapshot) -> _Snapshot:
        return _Snapshot(
            self.requests - other.requests,
            self.errors - other.errors,
            self.rows - other.rows,
            self.batches - other.batches,
            self.busy_s - other.busy_s,
        )

    def __add__(self, other: _Snapshot) -> _Snapshot:
        return _Snapshot(
            self.requests + other.requests,
            self.errors + other.errors,
            self.rows + other.rows,
            self.batches + other.batches,
            self.busy_s + other.busy_s,
        )


@dataclass
class _Window:
    """One model version's window, summed over its loaded copies (a version rolled back to is
    loaded again while the copy it replaced may still drain)."""

    counts: _Snapshot = field(default_factory=_Snapshot)
    latencies: list[float] = field(default_factory=list)
    queue_depth: int = 0

    def to_message(self, model: str, version: int) -> ModelTelemetry:
        c = self.counts
        pct = percentiles_of(self.latencies, PERCENTILES)
        return ModelTelemetry(
            model=model,
            version=version,
            requests=c.requests,
            errors=c.errors,
            rows=c.rows,
            batches=c.batches,
            p50_ms=pct[0] * 1000 if pct else None,
            p95_ms=pct[1] * 1000 if pct else None,
            p99_ms=pct[2] * 1000 if pct else None,
            mean_batch_size=c.rows / c.batches if c.batches else None,
            queue_depth=self.queue_depth,
            busy_s=round(max(0.0, c.busy_s), 6),
        )


class TelemetryCollector:
    def __init__(
        self,
        manager: ModelManager,
        accelerators: AcceleratorProbe,
        sketches: InputSketchBook | None = None,
        *,
        generative: Callable[[], GenerativeModels | None] = lambda: None,
        hourly_cost: float | None = None,
    ) -> None:
        """``generative``: the generative models, or None while there are none; their
        versions' windows (:mod:`agent.fleet.token_telemetry`) join the batch models', with
        their cost per 1k tokens where ``hourly_cost`` (the device's) is set."""
        self.manager = manager
        self.tokens = TokenWindows(generative, hourly_cost)
        self.accelerators = accelerators
        self.sketches = sketches
        """Where the service sketches served inputs; each window takes them (drift)."""
        self._last: dict[LoadedVersion, _Snapshot] = {}
        """What the last window read of each loaded version (by identity)."""
        self._departed: dict[LoadedVersion, None] = {}
        """Versions out of service whose last counts have not been sent (ordered set)."""
        self._window_start = time.monotonic()
        manager.watch_departures(self._departure)
        psutil.cpu_percent(interval=None)  # the first call only primes the counter

    def _departure(self, lv: LoadedVersion) -> None:
        self._departed[lv] = None

    def collect(self) -> tuple[float, list[ModelTelemetry], DeviceTelemetry]:
        now = time.monotonic()
        since, window = self._window_start, now - self._window_start
        self._window_start = now
        serving = {lv: None for e in self.manager.models.values() for lv in e.served.values()}
        finished = []
        for lv in list(self._departed):
            if lv in serving:  # back in service (a restore): read as served
                del self._departed[lv]
            elif lv.closed:  # read before its counts: a closed version's counts are final
                finished.append(lv)
        windows: dict[tuple[str, int], _Window] = {}
        for lv in serving:  # every served version, even with nothing to report
            windows.setdefault((lv.model, lv.version), _Window())
        for lv in (*serving, *self._departed):
            current = _Snapshot.of(lv.stats, lv.config.instances)
            counts = current - self._last.get(lv, _Snapshot())
            self._last[lv] = current
            latencies = lv.stats.latencies(since, now)
            if lv not in serving and counts == _Snapshot() and not latencies:
                continue  # out of service and idle: nothing to say
            w = windows.setdefault((lv.model, lv.version), _Window())
            w.counts += counts
            w.latencies += latencies
            w.queue_depth += lv.batcher.pending
        for lv in finished:
            del self._departed[lv]
        for lv in [lv for lv in self._last if lv not in serving and lv not in self._departed]:
            del self._last[lv]  # gone for good: its last counts were sent
        models = [w.to_message(model, version) for (model, version), w in windows.items()]
        models += self.tokens.collect(since, now)
        if self.sketches is not None:
            sketches = self.sketches.take_all()
            for m in models:
                if (taken := sketches.get((m.model, m.version))) is not None:
                    m.inputs, m.outputs, m.top1 = taken
        return window, models, self._device()

    def _device(self) -> DeviceTelemetry:
        memory = psutil.virtual_memory()
        return DeviceTelemetry(
            cpu_percent=psutil.cpu_percent(interval=None),
            memory_used_bytes=memory.total - memory.available,
            memory_total_bytes=memory.total,
            temperature_c=_temperature(),
            accelerators=self.accelerators.utilisation(),
        )


def _temperature() -> float | None:
    read = getattr(psutil, "sensors_temperatures", None)
    if read is None:
        return None
    try:
        sensors = read()
    except OSError:
        return None
    readings = [t.current for entries in sensors.values() for t in entries if t.current]
    return max(readings) if readings else None
