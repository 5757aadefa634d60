"""The periodic telemetry message: per-model counts and latency over the last window, and
device CPU, memory, temperature and accelerator use where readable."""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

from agent.accelerators import AcceleratorProbe
from agent.inference.manager import ModelManager
from common.protocol.messages import DeviceTelemetry, ModelTelemetry


@dataclass
class _Snapshot:
    requests: int
    errors: int
    rows: int
    batches: int


class TelemetryCollector:
    def __init__(self, manager: ModelManager, accelerators: AcceleratorProbe) -> None:
        self.manager = manager
        self.accelerators = accelerators
        self._last: dict[tuple[str, int], _Snapshot] = {}
        self._window_start = time.monotonic()
        psutil.cpu_percent(interval=None)  # the first call only primes the counter

    def collect(self) -> tuple[float, list[ModelTelemetry], DeviceTelemetry]:
        now = time.monotonic()
        since, window = self._window_start, now - self._window_start
        self._window_start = now
        models = []
        for entry in self.manager.models.values():
            for version, lv in entry.served.items():
                s = lv.stats
                current = _Snapshot(
                    s.success.count + s.fail.count,
                    s.model_errors(),
                    s.inference_count,
                    s.execution_count,
                )
                last = self._last.get((entry.name, version), _Snapshot(0, 0, 0, 0))
                if current.requests < last.requests or current.rows < last.rows:
                    # the version was loaded again (a rollback to it): its counters restarted
                    last = _Snapshot(0, 0, 0, 0)
                self._last[(entry.name, version)] = current
                pct = s.latency_percentiles(since, (50, 95, 99))
                batches = current.batches - last.batches
                models.append(
                    ModelTelemetry(
                        model=entry.name,
                        version=version,
                        requests=current.requests - last.requests,
                        errors=current.errors - last.errors,
                        rows=current.rows - last.rows,
                        batches=batches,
                        p50_ms=pct[0] * 1000 if pct else None,
                        p95_ms=pct[1] * 1000 if pct else None,
                        p99_ms=pct[2] * 1000 if pct else None,
                        mean_batch_size=(current.rows - last.rows) / batches if batches else None,
                        queue_depth=lv.batcher.pending,
                    )
                )
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
