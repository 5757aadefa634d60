"""One loaded model version: its runtimes (one per instance), batcher and statistics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import numpy as np
import psutil

from agent.errors import LoadError
from agent.inference.batcher import Batcher
from agent.inference.stats import VersionStats
from agent.inference.tuning import BatchTuning
from common.model_config import ModelConfig
from runtimes.backends import open_model
from runtimes.base import Placement, Runtime
from runtimes.datatypes import numpy_dtype
from runtimes.errors import RuntimeFailure
from runtimes.formats import ModelFormat
from runtimes.golden import GOLDEN_FILE, GoldenSample
from runtimes.settings import RuntimeSettings
from runtimes.signature import DYNAMIC, ModelSignature, TensorSpec

log = logging.getLogger("edgefleet.agent.models")


class VersionState(StrEnum):
    LOADING = "LOADING"
    STAGED = "STAGED"
    """Loaded and warm, waiting to be switched to (fleet updates)."""
    READY = "READY"
    STANDBY = "STANDBY"
    """Loaded and warm but not serving: the previous version kept for an instant rollback."""
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass
class VersionStatus:
    state: VersionState
    reason: str = ""


@dataclass(eq=False)
class LoadedVersion:
    model: str
    version: int
    config: ModelConfig
    placement: Placement
    format: ModelFormat
    model_file: Path
    signature: ModelSignature
    batcher: Batcher
    memory_bytes: int
    load_s: float
    stats: VersionStats = field(default_factory=VersionStats)
    tuning: BatchTuning | None = None
    """What ``[batching] tune`` measured at load, when it ran."""
    inflight: int = 0
    last_used: float = field(default_factory=time.monotonic)
    closed: bool = False
    """Retired: no request can reach it any more, so its statistics are final."""
    _released: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def platform(self) -> str:
        return f"{self.placement.runtime}_{self.format.value}"

    def acquire(self) -> None:
        self.inflight += 1
        self.last_used = time.monotonic()
        self._released.clear()

    def release(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._released.set()

    @property
    def idle(self) -> bool:
        return self.inflight == 0 and self.batcher.pending == 0 and self.batcher.running == 0

    async def retire(self) -> None:
        """Let requests already routed here finish, then close the runtimes."""
        try:
            if self.inflight:
                await self._released.wait()
            await self.batcher.drain()
            await self.batcher.close()
        finally:
            # even after a failed close: nothing routes here, and telemetry stops waiting
            self.closed = True


def estimate_memory_bytes(version_dir: Path, config: ModelConfig) -> int:
    """What loading is expected to cost, for the memory budget: the configured figure, or
    twice the model files (runtimes keep the weights plus working buffers) per instance."""
    if config.memory_mb is not None:
        return config.memory_mb * 2**20 * config.instances
    files = sum(
        p.stat().st_size for p in version_dir.iterdir() if p.is_file() and p.name != GOLDEN_FILE
    )
    return 2 * files * config.instances


RuntimeFactory = Callable[[Path, Placement, RuntimeSettings], Runtime]
"""Creates and loads one runtime instance; :func:`runtimes.backends.open_model` in production."""


def accounted_memory_bytes(version_dir: Path, config: ModelConfig, rss_added: int) -> int:
    """What a loaded version counts against the budget: the configured figure if given,
    else what loading added to the process, but never less than the model files (RSS growth
    misses memory-mapped weights)."""
    if config.memory_mb is not None:
        return config.memory_mb * 2**20 * config.instances
    return max(rss_added, estimate_memory_bytes(version_dir, config) // 2)


def open_instances(
    model_file: Path,
    placement: Placement,
    settings: RuntimeSettings,
    config: ModelConfig,
    cpu_count: int,
    factory: RuntimeFactory = open_model,
    *,
    cpus_limited: bool = False,
) -> tuple[list[Runtime], int]:
    """Load one runtime per instance (blocking), splitting ``cpu_count`` threads between them
    when there are several instances, or when ``cpus_limited`` (a container's CPU quota or
    cpuset, which ONNX Runtime and OpenVINO do not see when they size their thread pools).

    Returns the runtimes and the resident memory they added.
    """
    if settings.intra_op_threads == 0 and (config.instances > 1 or cpus_limited):
        threads = max(1, cpu_count // config.instances)
        settings = settings.model_copy(update={"intra_op_threads": threads})
    rss_before = psutil.Process().memory_info().rss
    runtimes: list[Runtime] = []
    try:
        for _ in range(config.instances):
            runtimes.append(factory(model_file, placement, settings))
    except BaseException:
        for rt in runtimes:
            rt.close()
        raise
    return runtimes, max(0, psutil.Process().memory_info().rss - rss_before)


def warm_up(
    runtimes: list[Runtime], version_dir: Path, config: ModelConfig
) -> dict[str, np.ndarray] | None:
    """Run the golden sample (or, without one, zeros of batch 1) through every instance;
    return the inputs that ran, or None when zeros could not.

    Zeros that fail on a model with dynamic dimensions besides the batch are a warning, not a
    failure: a size of 1 is not valid for every model (a convolution of a dynamic-resolution
    image needs more than its kernel), and no other size is known without a golden sample.
    Such a version serves unwarmed and untested; a golden sample warms and tests it.

    Raises:
        LoadError: a tensor has a datatype the agent cannot carry, the golden output does not
            match, zeros fail on a model of fixed dimensions, or a golden file is required
            and absent.
    """
    signature = runtimes[0].signature
    check_datatypes(signature)
    golden_path = version_dir / GOLDEN_FILE
    if config.warmup.golden and golden_path.is_file():
        golden = GoldenSample.load(golden_path)
        for i, runtime in enumerate(runtimes):
            try:
                problems = golden.mismatches(runtime.infer(golden.inputs))
            except RuntimeFailure as exc:
                raise LoadError(f"self-test failed on instance {i}: {exc}") from exc
            if problems:
                raise LoadError(f"self-test failed on instance {i}: " + "; ".join(problems))
        return dict(golden.inputs)
    if config.warmup.require_golden:
        raise LoadError(f"no {GOLDEN_FILE} in {version_dir}, and warmup.require_golden is set")
    zeros = {t.name: _zeros(t) for t in signature.inputs}
    try:
        for runtime in runtimes:
            runtime.infer(zeros)
    except RuntimeFailure as exc:
        skip = 1 if signature.batched else 0
        dynamic = [t.name for t in signature.inputs if not t.ranked or DYNAMIC in t.shape[skip:]]
        if not dynamic:
            raise LoadError(f"warm-up with zeros failed: {exc}") from exc
        log.warning(
            "warm-up with zeros failed on dynamic dimensions: serving unwarmed; add a "
            f"{GOLDEN_FILE} to warm up and self-test this version",
            extra={"model_dir": str(version_dir), "inputs": dynamic, "reason": str(exc)},
        )
        return None
    return zeros


def batching_problem(runtime: Runtime, inputs: dict[str, np.ndarray]) -> str | None:
    """Why requests cannot share a batch of this model, or None: ``inputs`` stacked twice must
    run and come back with twice the rows in every output. A dynamic first dimension on every
    tensor is read as the batch (:attr:`ModelSignature.batched`), and is not always one:
    NonZero's ``[K, 2]`` output, a detector's boxes after non-maximum suppression."""
    rows = next(iter(inputs.values())).shape[0]
    doubled = {k: np.concatenate([v, v]) for k, v in inputs.items()}
    try:
        outputs = runtime.infer(doubled)
    except RuntimeFailure as exc:
        return f"{2 * rows} rows failed where {rows} ran: {exc}"
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != 2 * rows:
            return f"output {name!r} has shape {list(array.shape)} for {2 * rows} rows in"
    return None


def check_datatypes(signature: ModelSignature) -> None:
    """Refuse a model with a tensor the agent has no numpy type for (BF16): a backend may load
    it, but no request could be decoded for it nor its answer encoded.

    Raises:
        LoadError: naming the first such tensor and its datatype.
    """
    for role, specs in (("input", signature.inputs), ("output", signature.outputs)):
        for spec in specs:
            try:
                numpy_dtype(spec.datatype)
            except KeyError:
                raise LoadError(
                    f"{role} {spec.name!r} has datatype {spec.datatype}, which this agent "
                    "cannot serve (it has no numpy equivalent)"
                ) from None


def _zeros(spec: TensorSpec) -> np.ndarray:
    shape = [1 if d == DYNAMIC else d for d in spec.shape]
    if spec.datatype == "BYTES":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=numpy_dtype(spec.datatype))
