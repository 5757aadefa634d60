"""Loading one version for :class:`agent.inference.manager.ModelManager`, as named steps
(:meth:`VersionLoader.load`): place it where the hardware plan says (and make room in the memory
budget), open its instances there (the profile's next candidate if that device fails or refuses
the model), warm them up, measure the batch size, build its pipeline, then start its batcher and
self-test the pipeline. Any error while loading a version (a bug too) leaves that version
UNAVAILABLE with the reason.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from agent.errors import AgentError, LoadError, MemoryBudgetError
from agent.inference import tuning_cache
from agent.inference.batcher import INLINE_MAX_S, Batcher, BatchObserver
from agent.inference.pipelined import PipelineVersion
from agent.inference.priority import run_lowered
from agent.inference.stats import VersionStats
from agent.inference.tuning import BatchTuning, instances_kept, tune_batch_size, with_instances
from agent.inference.tuning_cache import TuningKey
from agent.inference.versions import (
    LoadedVersion,
    RuntimeFactory,
    VersionState,
    VersionStatus,
    accounted_memory_bytes,
    batching_problem,
    estimate_memory_bytes,
    open_instances,
    warm_up,
)
from agent.pipelines import cgroups
from agent.pipelines.pipeline import ModelCall, Pipeline
from agent.pipelines.settings import PipelineSettings, PythonSteps
from agent.pipelines.version import pipeline_config, pipeline_self_test, python_refusal
from common.model_config import ModelConfig
from common.pipeline_config import PipelineConfig
from common.pipeline_steps import DecodeBudget
from runtimes.backends.onnxruntime_backend import OnnxRuntimeBackend
from runtimes.base import Placement, Runtime
from runtimes.errors import DeviceUnavailableError, RuntimeFailure, UnsupportedModelError
from runtimes.formats import ModelFormat, find_model_file
from runtimes.hardware.context import HardwareContext
from runtimes.hardware.heap import trim_heap
from runtimes.hardware.select import Plan
from runtimes.settings import RuntimeSettings

if TYPE_CHECKING:
    from agent.inference.manager import ModelEntry
    from agent.metrics import AgentMetrics

log = logging.getLogger("edgefleet.agent.models")

MakeRoom = Callable[[str, int, str], Awaitable[None]]
"""(model, bytes needed, what for): evict idle models until that fits the memory budget, or
raise :class:`MemoryBudgetError`."""
CallerFor = Callable[[PipelineVersion], ModelCall]
"""How a pipeline version's self-test calls models."""


@dataclass
class Opened:
    """A version's instances, open and warm, and what measuring them decided."""

    runtimes: list[Runtime]
    rss_added: int
    batched: bool
    tuning: BatchTuning | None


@dataclass
class LoadAttempt:
    """What one load of a version has found so far, step by step."""

    entry: ModelEntry
    version: int
    version_dir: Path
    config: ModelConfig
    verified: bool
    previous: VersionStatus | None
    """The version's status before this load (kept if it serves and this load fails)."""
    name: str = ""
    steps: PipelineConfig | None = None
    model_file: Path = field(default_factory=Path)
    fmt: ModelFormat | None = None
    plan: Plan | None = None
    chosen: bool = False
    """The instances are the agent's choice (``instances = 0``): measuring may keep fewer."""
    started: float = 0.0
    opened: Opened | None = None
    pipeline: Pipeline | None = None
    load_s: float = 0.0

    def log_extra(self, **more: object) -> dict[str, object]:
        return {"model": self.entry.name, "version": self.version, **more}


class VersionLoader:
    """Loads versions for the model manager; the manager keeps what serves."""

    def __init__(
        self,
        hardware: HardwareContext,
        runtime_settings: RuntimeSettings,
        *,
        cpu_count: int,
        cpus_limited: bool,
        runtime_factory: RuntimeFactory,
        pipelines: PipelineSettings,
        step_executor: Executor,
        make_room: MakeRoom,
        caller_for: CallerFor,
        metrics: AgentMetrics | None = None,
    ) -> None:
        """``cpus_limited``: a cgroup quota or cpuset below the processors, so the runtimes
        must not size their thread pools by the processors they see."""
        self.hardware = hardware
        self.runtime_settings = runtime_settings
        self.cpu_count = cpu_count
        self.cpus_limited = cpus_limited
        self.runtime_factory = runtime_factory
        self.pipelines = pipelines
        self.step_executor = step_executor
        self.decode_budget = DecodeBudget(pipelines.max_decoded_pixels)
        self.cgroups = cgroups.probe() if pipelines.python_steps != PythonSteps.OFF else None
        if self.cgroups is not None:
            log.info(
                "python step cgroups",
                extra={"cgroups": self.cgroups.support, "reason": self.cgroups.reason},
            )
        """The pixels decoded by the image steps of every pipeline, at once."""
        self.make_room = make_room
        self.caller_for = caller_for
        self.metrics = metrics

    async def load(
        self,
        entry: ModelEntry,
        version: int,
        version_dir: Path,
        config: ModelConfig,
        *,
        verified: bool = False,
    ) -> LoadedVersion:
        """Load, warm and start ``version`` of ``entry`` (not serving it yet).

        Raises:
            LoadError: it does not load, warm up or pass its self-test.
            MemoryBudgetError: it does not fit the memory budget.
        """
        at = LoadAttempt(entry, version, version_dir, config, verified, entry.status.get(version))
        at.name = f"{entry.name}:{version}"
        entry.status[version] = VersionStatus(VersionState.LOADING)
        try:
            await self._place(at)
            await self._open(at)
            await self._build_pipeline(at)
        except Exception as exc:
            error = self._failed(at, exc)
            if error is exc:
                raise  # as it is: MemoryBudgetError keeps its code (and its 409)
            raise error from exc
        lv = self._version(at)
        lv.batcher.start()
        if isinstance(lv, PipelineVersion):
            await self._self_test(at, lv)
        assert at.plan is not None
        log.info(
            "version loaded",
            extra=at.log_extra(placement=at.plan.placement.describe(), load_s=round(at.load_s, 3)),
        )
        return lv

    # -- the steps ------------------------------------------------------------------------

    async def _place(self, at: LoadAttempt) -> None:
        """Find the model file and its pipeline, plan where it runs and how many instances,
        and make room for it in the memory budget."""
        at.steps = pipeline_config(at.version_dir, at.config)
        at.model_file, at.fmt = find_model_file(at.version_dir)
        at.plan = self.hardware.plan(at.entry.name, at.fmt, at.config.placement)
        # instances = 0: one per core on a CPU (the first candidate's device decides)
        at.chosen = not at.config.instances
        at.config = with_instances(
            at.config,
            at.plan.placement.device,
            self.cpu_count,
            self.runtime_settings.intra_op_threads,
        )
        needed = estimate_memory_bytes(at.version_dir, at.config)
        await self.make_room(at.entry.name, needed, at.name)
        at.started = time.monotonic()

    async def _open(self, at: LoadAttempt) -> None:
        """Open, warm and measure the instances at the planned placement, else at the profile's
        next candidate (unless the placement is pinned)."""
        assert at.plan is not None and at.fmt is not None
        failed: dict[str, str] = {}
        while True:
            try:
                # at the inference threads' priority: a backend's own threads inherit it
                at.opened = await run_lowered(
                    self.runtime_settings.compute_nice_offset,
                    f"load:{at.name}",
                    functools.partial(self._instances, at, at.plan.placement),
                )
                break
            except (DeviceUnavailableError, UnsupportedModelError) as exc:
                if at.plan.pinned:  # a pin is the user's choice: no fallback
                    raise
                # The device is gone or refuses this model (an NPU compiler and a dynamic
                # shape, a delegate that does not load): the profile's next candidate.
                failed[at.plan.placement.describe()] = str(exc)
                log.warning(
                    "placement failed to load: trying the next candidate",
                    extra=at.log_extra(placement=at.plan.placement.describe(), reason=str(exc)),
                )
                at.plan = self.hardware.plan(at.entry.name, at.fmt, at.config.placement, failed)
        if len(at.opened.runtimes) != at.config.instances:
            at.config = at.config.model_copy(update={"instances": len(at.opened.runtimes)})

    def _instances(self, at: LoadAttempt, placement: Placement) -> Opened:
        """In a thread of its own: open the instances, warm them up, measure the batch size."""
        runtimes, rss_added = open_instances(
            at.model_file,
            placement,
            self.runtime_settings,
            at.config,
            self.cpu_count,
            self.runtime_factory,
            cpus_limited=self.cpus_limited,
        )
        try:
            ran, batched = self._warm(at, runtimes)
            tuning = self._tune(at, runtimes, ran) if batched and ran else None
        except BaseException:
            for rt in runtimes:
                rt.close()
            raise
        if tuning is not None and at.chosen:  # a model bound by the event loop keeps one
            kept = instances_kept(tuning, len(runtimes))
            for rt in runtimes[kept:]:
                rt.close()
            runtimes = runtimes[:kept]
        trim_heap()  # what the load, warm-up and measurement used and freed
        return Opened(runtimes, rss_added, batched, tuning)

    def _warm(
        self, at: LoadAttempt, runtimes: list[Runtime]
    ) -> tuple[dict[str, np.ndarray] | None, bool]:
        """Warm every instance up; the inputs that ran, and whether requests batch (the model
        and its config allow it, and its outputs follow the batch dimension)."""
        ran = warm_up(runtimes, at.version_dir, at.config)
        batched = runtimes[0].signature.batched and at.config.batching.max_batch_size > 0
        problem = batching_problem(runtimes[0], ran) if batched and ran else None
        if problem is not None:
            log.warning(
                "outputs do not follow the batch dimension: requests run one at a time",
                extra=at.log_extra(reason=problem),
            )
        return ran, batched and problem is None

    def _tune(
        self, at: LoadAttempt, runtimes: list[Runtime], ran: dict[str, np.ndarray]
    ) -> BatchTuning | None:
        """Measure the batch size, where the config asks for it."""
        batching = at.config.batching
        if not (batching.measured and batching.max_batch_size > 1):
            return None
        cache_dir = self.runtime_settings.cache_dir
        key = None
        if cache_dir is not None and at.plan is not None:
            key = TuningKey(
                at.model_file,
                at.plan.placement.describe(),
                len(runtimes),
                self.runtime_settings.intra_op_threads,
                batching.max_batch_size,
                self.cpu_count,
            )
            kept = tuning_cache.load(cache_dir, key)
            if kept is not None:
                log.info("batch size from the cache", extra=at.log_extra(**kept.describe()))
                return kept
        tuning = tune_batch_size(runtimes, ran, batching.max_batch_size)
        log.info("batch size measured", extra=at.log_extra(**tuning.describe()))
        if cache_dir is not None and key is not None:
            tuning_cache.store(cache_dir, key, tuning)
        return tuning

    async def _build_pipeline(self, at: LoadAttempt) -> None:
        """Build the version's pipeline, if it has one (its instances closed if that fails)."""
        assert at.opened is not None
        if at.steps is not None:
            try:
                at.pipeline = await Pipeline.build(
                    at.steps,
                    at.version_dir,
                    at.opened.runtimes[0].signature,
                    self.pipelines,
                    python_allowed=python_refusal(
                        at.steps, at.version_dir, self.pipelines, verified=at.verified
                    ),
                    decode_budget=self.decode_budget,
                    cgroups=self.cgroups,
                )
            except BaseException:
                for rt in at.opened.runtimes:
                    rt.close()
                raise
        at.load_s = time.monotonic() - at.started

    def _failed(self, at: LoadAttempt, exc: Exception) -> Exception:
        """Record why ``at`` failed and return the error to raise: ``exc`` itself for the
        agent's own errors that are not a LoadError, else a LoadError with the reason."""
        # Whatever went wrong, the version must not stay LOADING: it is UNAVAILABLE with
        # the reason, and the error raised is one the API and the start-up load expect.
        reason = str(exc) or repr(exc)
        self._unavailable(at, reason)
        expected = isinstance(exc, (RuntimeFailure, AgentError))
        log.error(
            "version failed to load",
            exc_info=None if expected else exc,  # anything else is a bug: its traceback
            extra=at.log_extra(reason=reason),
        )
        if isinstance(exc, MemoryBudgetError) or (
            isinstance(exc, AgentError) and not isinstance(exc, LoadError)
        ):
            return exc
        return LoadError(f"model {at.entry.name!r} version {at.version}: {reason}")

    @staticmethod
    def _unavailable(at: LoadAttempt, reason: str) -> None:
        # A version that was serving keeps its READY status; the failure is the new one's.
        if at.version in at.entry.served and at.previous is not None:
            at.entry.status[at.version] = at.previous
        else:
            at.entry.status[at.version] = VersionStatus(VersionState.UNAVAILABLE, reason)

    def _version(self, at: LoadAttempt) -> LoadedVersion:
        """The loaded version: its statistics, its batcher over the instances."""
        assert at.opened is not None and at.plan is not None and at.fmt is not None
        runtimes, tuning = at.opened.runtimes, at.opened.tuning
        stats = VersionStats()
        observer: BatchObserver = stats.record_batch
        if self.metrics is not None:
            observer = self.metrics.batch_observer(at.entry.name, str(at.version), stats)
        kind: Callable[..., LoadedVersion] = LoadedVersion
        if at.pipeline is not None:
            kind = functools.partial(
                PipelineVersion, pipeline=at.pipeline, model_signature=runtimes[0].signature
            )
        config = at.config  # with the instances that opened
        return kind(
            model=at.entry.name,
            version=at.version,
            config=config,
            placement=at.plan.placement,
            format=at.fmt,
            model_file=at.model_file,
            signature=runtimes[0].signature if at.pipeline is None else at.pipeline.signature,
            batcher=Batcher(
                at.name,
                runtimes,
                config.batching if tuning is None else tuning.applied_to(config.batching),
                batched=at.opened.batched,
                observer=observer,
                nice_offset=self.runtime_settings.compute_nice_offset,
                # ONNX Runtime's own sessions only: a call as long for the same shapes every
                # time (a wrapper around one may block the loop: the tests' gated runtimes)
                inline_max_s=INLINE_MAX_S
                if all(type(rt) is OnnxRuntimeBackend for rt in runtimes)
                else 0.0,
            ),
            memory_bytes=accounted_memory_bytes(at.version_dir, config, at.opened.rss_added),
            load_s=at.load_s,
            stats=stats,
            tuning=tuning,
        )

    async def _self_test(self, at: LoadAttempt, lv: PipelineVersion) -> None:
        """Run the pipeline's golden sample through it; a failure retires the version."""
        problem = await pipeline_self_test(
            lv, at.version_dir, self.caller_for(lv), self.step_executor
        )
        if problem is None:
            return
        await lv.retire()
        if not (at.version in at.entry.served and at.previous is not None):
            at.entry.status[at.version] = VersionStatus(VersionState.UNAVAILABLE, problem)
        log.error("version failed to load", extra=at.log_extra(reason=problem))
        raise LoadError(f"model {at.entry.name!r} version {at.version}: {problem}")
