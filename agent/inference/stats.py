"""Cumulative per-version statistics in the shape of Triton's statistics extension.

Cumulative ``{count, ns}`` pairs let a client compute averages between two samples. As in
Triton, ``success``, ``queue`` and the three ``compute_*`` durations count requests (a request
in a batch of eight adds its batch's durations once), and ``batch_stats`` counts executions:
``compute_input`` is stacking the requests' inputs into the batch, ``compute_infer`` the
backend's run, ``compute_output`` splitting the outputs by request. perf_analyzer refuses
statistics whose three compute counts differ. There is no response cache: ``cache_hit`` and
``cache_miss`` stay zero, as on a Triton without one.
NOTE: https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_statistics.md
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

RECENT_SAMPLES = 4096
MODEL_ERROR_CODES = frozenset({"inference_failed", "deadline_exceeded", "overloaded"})


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9)

    def to_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchSizeStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)

    def to_dict(self, size: int) -> dict[str, Any]:
        return {
            "batch_size": size,
            "compute_input": self.compute_input.to_dict(),
            "compute_infer": self.compute_infer.to_dict(),
            "compute_output": self.compute_output.to_dict(),
        }


@dataclass
class VersionStats:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0
    """Rows inferred (a request of 4 rows counts 4)."""
    execution_count: int = 0
    """Batches run."""
    busy_ns: int = 0
    """Time the instances spent on batches (stacking, backend, splitting), summed over the
    instances: what the device's cost is charged by (telemetry's ``busy_s``)."""
    last_inference_ms: int = 0
    fail_by_reason: dict[str, int] = field(default_factory=dict)
    batch_sizes: dict[int, BatchSizeStats] = field(default_factory=dict)
    recent: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=RECENT_SAMPLES))
    """(monotonic time, seconds) of the latest successful requests, for percentiles."""
    failed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set on every failure that points at the model; health windows wait on it."""

    def record_batch(
        self, rows: int, compute_s: float, input_s: float = 0.0, output_s: float = 0.0
    ) -> None:
        """One execution of ``rows``: ``compute_s`` in the backend, ``input_s`` stacking its
        inputs, ``output_s`` splitting its outputs."""
        self.execution_count += 1
        self.inference_count += rows
        self.busy_ns += int((compute_s + input_s + output_s) * 1e9)
        size = self.batch_sizes.setdefault(rows, BatchSizeStats())
        size.compute_input.add(input_s)
        size.compute_infer.add(compute_s)
        size.compute_output.add(output_s)
        self.last_inference_ms = int(time.time() * 1000)  # wall clock: it is a timestamp

    def record_success(
        self,
        total_s: float,
        queue_s: float,
        compute_s: float,
        input_s: float = 0.0,
        output_s: float = 0.0,
    ) -> None:
        """A request answered: ``compute_s`` is its batch's whole time in the instance, of
        which ``input_s`` stacking and ``output_s`` splitting."""
        self.recent.append((time.monotonic(), total_s))
        self.success.add(total_s)
        self.queue.add(queue_s)
        self.compute_input.add(input_s)
        self.compute_infer.add(max(0.0, compute_s - input_s - output_s))
        self.compute_output.add(output_s)

    def record_failure(self, total_s: float, reason: str) -> None:
        self.fail.add(total_s)
        self.fail_by_reason[reason] = self.fail_by_reason.get(reason, 0) + 1
        if reason in MODEL_ERROR_CODES:
            self.failed.set()

    def model_errors(self) -> int:
        """Failures that point at the model or its capacity, not at the client's request."""
        return sum(n for code, n in self.fail_by_reason.items() if code in MODEL_ERROR_CODES)

    def latency_percentiles(
        self, since: float, percentiles: tuple[float, ...]
    ) -> list[float] | None:
        """Latency percentiles (seconds) of successful requests after monotonic ``since``."""
        return percentiles_of([s for t, s in self.recent if t >= since], percentiles)

    def latencies(self, since: float, until: float) -> list[float]:
        """Latencies (seconds) of the recent successful requests that ended in the monotonic
        window ``[since, until)``: consecutive windows share no sample."""
        return [s for t, s in self.recent if since <= t < until]

    def to_dict(self, name: str, version: str) -> dict[str, Any]:
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.to_dict(),
                "fail": self.fail.to_dict(),
                "queue": self.queue.to_dict(),
                "compute_input": self.compute_input.to_dict(),
                "compute_infer": self.compute_infer.to_dict(),
                "compute_output": self.compute_output.to_dict(),
                "cache_hit": Duration().to_dict(),
                "cache_miss": Duration().to_dict(),
            },
            "fail_by_reason": dict(self.fail_by_reason),
            "batch_stats": [s.to_dict(size) for size, s in sorted(self.batch_sizes.items())],
        }


def percentiles_of(samples: list[float], percentiles: tuple[float, ...]) -> list[float] | None:
    """The nearest-rank ``percentiles`` of ``samples``, or None when there are none."""
    if not samples:
        return None
    ordered = sorted(samples)
    return [ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] for p in percentiles]
