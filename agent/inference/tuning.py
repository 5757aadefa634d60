"""Chosen at load on the device: the number of instances, and whether a batch costs less per
row than one row (the batch size).

A model's config may leave its instance count to the agent (``instances = 0``, the default):
on a CPU each instance then gets one core, up to :data:`MAX_AUTO_INSTANCES`
(:func:`with_instances`). On two cores, two single-threaded sessions serve ``cnn`` faster than
one session of two threads, whose threads wait on each other inside every operator of a small
batch (benchmarks/findings.md); a device (GPU, NPU) gets one.

Whether batching pays depends on the model and the device, not on the model alone. A small
dense model is dominated by the cost of a call, and batches of 32 run at many times the rate of
single rows; a convolutional network on one single-threaded CPU session runs two rows at about
the cost of two single rows (on a Xeon, raw ONNX Runtime ran ``cnn`` at 422, 427 and 430 rows/s
at batch 1, 2 and 4), and there a batch only makes each request wait for the others' rows. The
same signed manifest goes to a Raspberry Pi and to a NUC, so the choice is measured where the
model runs, with ``[batching] tune = true`` in its config.

The measurement, within :data:`BUDGET_S`: every instance runs the warm-up's first row stacked to
batch sizes 1, 2, 4, ... side by side (the cores shared as they are in serving), a size being
measured only while the one below it gained; :data:`ROUNDS` rounds, each size's best rate kept
(the rate least disturbed by whatever else ran). The batch size kept is the largest reached by
steps that each gained at least :data:`MIN_GAIN` in rows per second; 1 turns batching off.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from common.model_config import BatchingConfig, ModelConfig
from runtimes.base import Runtime
from runtimes.errors import RuntimeFailure

MAX_AUTO_INSTANCES = 4
"""Most instances chosen at load: each holds its own copy of the model's weights."""
MIN_GAIN = 0.05
"""A step to the next batch size must raise rows per second by this fraction to be taken:
forming batches costs the event loop a little, and each request waits for the others' rows."""
CHEAP_BATCH_S = 0.005
"""Where batching pays and a batch of ``max_batch_size`` rows takes less than this on one
instance (at the best rate measured), that size is kept rather than the size where the rows per
second stopped gaining: for a model that cheap the event loop's work per batch, not the model,
sets the pace under load. ``mlp`` on two instances, capped at 4 rows by the measurement, served
JSON at 32 clients at 3,043-3,390 requests/s against 3,495-5,139 with batches of up to 32
(2026-12-06, ``python -m benchmarks.serving.ab``)."""
CHEAP_ROW_S = 0.001
"""An instance count chosen by the agent drops to one where one row runs in less than this (at
the rate measured at one row): such a model is bound by the event loop, not its compute, and a
second instance only splits the batches and takes the cores from the loop. ``mlp``, JSON, 32
clients, two instances against one, both batched up to 32 rows: batches of 9-11 rows against
16-20, 1,782-3,037 requests/s against 2,332-4,360 (a busy machine, 2026-12-06)."""
ROUNDS = 3
BUDGET_S = 0.5
"""Most seconds the measurement may take; past it, what has been measured decides."""
MIN_RUN_S = 0.01
"""Each measurement repeats a batch until it has taken about this long, so that a model of a
few microseconds is not timed by one call."""


@dataclasses.dataclass(frozen=True)
class BatchTuning:
    """What the measurement found, for the log and the model's metadata."""

    rows_per_s: dict[int, float]
    """Best rate measured at each batch size, all instances running side by side."""
    max_batch_size: int
    """The largest size every step to which gained :data:`MIN_GAIN`; 1 means no batching."""
    elapsed_s: float
    failed: dict[int, str] = dataclasses.field(default_factory=dict)
    """Sizes whose run failed, with the error: such a size ends the walk."""

    def applied_to(self, batching: BatchingConfig) -> BatchingConfig:
        """``batching`` capped at the size found (0, no batching, where it was 1), its
        preferred sizes above that dropped."""
        size = self.max_batch_size if self.max_batch_size > 1 else 0
        preferred = tuple(s for s in batching.preferred_batch_sizes if s <= size)
        return batching.model_copy(
            update={"max_batch_size": size, "preferred_batch_sizes": preferred}
        )

    def describe(self) -> dict[str, object]:
        return {
            "max_batch_size": self.max_batch_size,
            "rows_per_s": {str(b): round(r, 1) for b, r in sorted(self.rows_per_s.items())},
            "elapsed_s": round(self.elapsed_s, 3),
        } | ({"failed": {str(b): e for b, e in self.failed.items()}} if self.failed else {})


def with_instances(
    config: ModelConfig, device: str, cpus: int, intra_op_threads: int = 0
) -> ModelConfig:
    """``config`` with its instance count chosen where it leaves it to the agent (0): on a CPU
    one per ``intra_op_threads`` (one when 0) of the ``cpus`` usable, at most
    :data:`MAX_AUTO_INSTANCES`; on another device one. The threads are split between the
    instances when they load (:func:`agent.inference.versions.open_instances`)."""
    if config.instances:
        return config
    count = 1
    if device.upper() == "CPU":
        count = max(1, min(MAX_AUTO_INSTANCES, cpus // max(intra_op_threads, 1)))
    return config.model_copy(update={"instances": count})


def same_config(served: ModelConfig, asked: ModelConfig) -> bool:
    """Whether a version served with ``served`` (its instance count chosen) serves what
    ``asked`` asks for, so that a reload keeps it."""
    if not asked.instances:
        asked = asked.model_copy(update={"instances": served.instances})
    return served == asked


def sizes_up_to(limit: int) -> list[int]:
    """1, 2, 4, ... doubling, the last one ``limit`` itself."""
    sizes = [1]
    while sizes[-1] < limit:
        sizes.append(min(2 * sizes[-1], limit))
    return sizes


def chosen_size(rows_per_s: Mapping[int, float], limit: int, min_gain: float = MIN_GAIN) -> int:
    """The largest of :func:`sizes_up_to` ``limit`` reached by steps that each gained at least
    ``min_gain``; a size not measured ends the walk."""
    chosen = 1
    for size in sizes_up_to(limit)[1:]:
        if size not in rows_per_s or rows_per_s[size] < (1 + min_gain) * rows_per_s[chosen]:
            break
        chosen = size
    return chosen


def search(
    rate: Callable[[int], float],
    limit: int,
    *,
    rounds: int = ROUNDS,
    budget_s: float = BUDGET_S,
    min_gain: float = MIN_GAIN,
    clock: Callable[[], float] = time.monotonic,
) -> BatchTuning:
    """Walk up the batch sizes ``rounds`` times with ``rate`` (rows per second at a size),
    each walk stopping at the first size that did not gain on the best rates so far.

    The first two walks measure 1 and 2 whatever the budget: without them nothing is
    decided, and a second look at each keeps one disturbed run (a busy device) from deciding.
    """
    started = clock()
    best: dict[int, float] = {}
    sizes = sizes_up_to(limit)
    for walk in range(rounds):
        for i, size in enumerate(sizes):
            if (walk > 1 or i > 1) and clock() - started > budget_s:
                break
            best[size] = max(best.get(size, 0.0), rate(size))
            if i and best[size] < (1 + min_gain) * best[sizes[i - 1]]:
                break
        if walk > 0 and clock() - started > budget_s:
            break
    return BatchTuning(best, chosen_size(best, limit, min_gain), clock() - started)


def tune_batch_size(
    runtimes: Sequence[Runtime], inputs: Mapping[str, np.ndarray], limit: int
) -> BatchTuning:
    """Measure ``runtimes`` (every instance of a version, loaded and warm) at batch sizes up to
    ``limit`` on the first row of ``inputs`` (the warm-up's), and choose (blocking)."""
    row = {name: array[:1] for name, array in inputs.items()}
    stacked: dict[int, dict[str, np.ndarray]] = {}
    failed: dict[int, str] = {}
    one_s = math.inf
    for _ in range(3):  # the fastest of up to three, unless one alone is long enough
        started = time.perf_counter()
        runtimes[0].infer(row)
        one_s = min(one_s, time.perf_counter() - started)
        if one_s >= MIN_RUN_S:
            break
    repeat = max(1, math.ceil(MIN_RUN_S / max(one_s, 1e-6)))

    def run(runtime: Runtime, batch: Mapping[str, np.ndarray], times: int) -> None:
        for _ in range(times):
            runtime.infer(batch)

    with ThreadPoolExecutor(len(runtimes), thread_name_prefix="tune") as pool:

        def rate(size: int) -> float:
            batch = stacked.setdefault(
                size, {name: np.repeat(a, size, axis=0) for name, a in row.items()}
            )
            if size in failed:
                return 0.0
            times = max(1, math.ceil(repeat / size))
            started = time.perf_counter()
            runs = [pool.submit(run, rt, batch, times) for rt in runtimes]
            futures.wait(runs)  # every instance idle again before the next size
            elapsed = time.perf_counter() - started
            for done in runs:
                exc = done.exception()
                if exc is None:
                    continue
                # One row ran at the warm-up and two in batching_problem; a larger batch that
                # fails (a device's memory, a model compiled for fixed sizes) ends the walk.
                if size <= 2 or not isinstance(exc, RuntimeFailure):
                    raise exc
                failed[size] = str(exc)
                return 0.0
            return len(runtimes) * times * size / elapsed

        tuning = dataclasses.replace(search(rate, limit), failed=failed)
    return dataclasses.replace(tuning, max_batch_size=kept_size(tuning, limit, len(runtimes)))


def instances_kept(tuning: BatchTuning, instances: int) -> int:
    """How many of ``instances`` (a count the agent chose) to keep after the measurement:
    one where a row runs in under :data:`CHEAP_ROW_S`, else all."""
    one_row = tuning.rows_per_s.get(1)
    if not one_row:
        return instances
    return 1 if instances / one_row < CHEAP_ROW_S else instances


def kept_size(tuning: BatchTuning, limit: int, instances: int) -> int:
    """The size :func:`search` chose, or ``limit`` where batching pays and a batch of
    ``limit`` rows at the best rate measured takes under :data:`CHEAP_BATCH_S` on one of the
    ``instances``; not where a size failed to run."""
    if tuning.max_batch_size <= 1 or tuning.failed:
        return tuning.max_batch_size
    row_s = instances / max(tuning.rows_per_s.values())
    return limit if limit * row_s < CHEAP_BATCH_S else tuning.max_batch_size
