"""Loading one version for :class:`agent.inference.manager.ModelManager`: open its
instances where the hardware plan places it (the profile's next candidate if that device fails
or refuses the model), warm them up, measure the batch size, build its pipeline, and make room
in the memory budget by evicting idle models. Any error while loading a version (a bug too)
leaves that version UNAVAILABLE with the reason.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from agent.errors import AgentError, LoadError, MemoryBudgetError
from agent.inference.batcher import INLINE_MAX_S, Batcher, BatchObserver
from agent.inference.priority import run_lowered
from agent.inference.stats import VersionStats
from agent.inference.tuning import BatchTuning, instances_kept, tune_batch_size, with_instances
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
from agent.pipelines.pipeline import ModelCall, Pipeline
from agent.pipelines.settings import PipelineSettings
from agent.pipelines.version import (
    PipelineVersion,
    pipeline_config,
    pipeline_self_test,
    python_refusal,
)
from common.model_config import ModelConfig
from runtimes.backends.onnxruntime_backend import OnnxRuntimeBackend
from runtimes.base import Placement, Runtime
from runtimes.errors import DeviceUnavailableError, RuntimeFailure, UnsupportedModelError
from runtimes.formats import find_model_file
from runtimes.hardware.context import HardwareContext
from runtimes.hardware.heap import trim_heap
from runtimes.settings import RuntimeSettings

if TYPE_CHECKING:
    from agent.inference.manager import ModelEntry
    from agent.metrics import AgentMetrics

log = logging.getLogger("edgefleet.agent.models")


class VersionLoading:
    """The loading half of :class:`agent.inference.manager.ModelManager`: what it reads is
    the manager's own state, set up in its ``__init__``."""

    models: dict[str, ModelEntry]
    hardware: HardwareContext
    runtime_settings: RuntimeSettings
    cpu_count: int
    cpus_limited: bool
    metrics: AgentMetrics | None
    runtime_factory: RuntimeFactory
    pipelines: PipelineSettings
    step_executor: ThreadPoolExecutor

    if TYPE_CHECKING:

        def used_memory_bytes(self) -> int: ...

        async def _unload(self, entry: ModelEntry) -> None: ...

        def model_caller(
            self, lv: PipelineVersion, priority: int, timeout_s: float | None
        ) -> ModelCall: ...

    async def _load_version(
        self,
        entry: ModelEntry,
        version: int,
        version_dir: Path,
        config: ModelConfig,
        *,
        verified: bool = False,
    ) -> LoadedVersion:
        name = f"{entry.name}:{version}"
        previous = entry.status.get(version)
        entry.status[version] = VersionStatus(VersionState.LOADING)
        pipeline: Pipeline | None = None
        try:
            steps = pipeline_config(version_dir, config)
            model_file, fmt = find_model_file(version_dir)
            plan = self.hardware.plan(entry.name, fmt, config.placement)
            settings = self.runtime_settings
            # instances = 0: one per core on a CPU (the first candidate's device decides)
            chosen = not config.instances
            config = with_instances(
                config, plan.placement.device, self.cpu_count, settings.intra_op_threads
            )
            await self._make_room(entry.name, estimate_memory_bytes(version_dir, config), name)
            started = time.monotonic()

            def load(placement: Placement) -> tuple[list[Runtime], int, bool, BatchTuning | None]:
                runtimes, rss_added = open_instances(
                    model_file,
                    placement,
                    settings,
                    config,
                    self.cpu_count,
                    self.runtime_factory,
                    cpus_limited=self.cpus_limited,
                )
                try:
                    ran = warm_up(runtimes, version_dir, config)
                    batched = runtimes[0].signature.batched and config.batching.max_batch_size > 0
                    problem = batching_problem(runtimes[0], ran) if batched and ran else None
                    batched = batched and problem is None
                    tuning = (
                        tune_batch_size(runtimes, ran, config.batching.max_batch_size)
                        if batched
                        and ran
                        and config.batching.measured
                        and config.batching.max_batch_size > 1
                        else None
                    )
                except BaseException:
                    for rt in runtimes:
                        rt.close()
                    raise
                if problem is not None:
                    log.warning(
                        "outputs do not follow the batch dimension: requests run one at a time",
                        extra={"model": entry.name, "version": version, "reason": problem},
                    )
                if tuning is not None:
                    log.info(
                        "batch size measured",
                        extra={"model": entry.name, "version": version, **tuning.describe()},
                    )
                    if chosen:  # a model bound by the event loop keeps one instance
                        kept = instances_kept(tuning, len(runtimes))
                        for rt in runtimes[kept:]:
                            rt.close()
                        runtimes = runtimes[:kept]
                trim_heap()  # what the load, warm-up and measurement used and freed
                return runtimes, rss_added, batched, tuning

            failed: dict[str, str] = {}
            while True:
                try:
                    # at the inference threads' priority: a backend's own threads inherit it
                    runtimes, rss_added, batched, tuning = await run_lowered(
                        settings.compute_nice_offset,
                        f"load:{name}",
                        functools.partial(load, plan.placement),
                    )
                    if len(runtimes) != config.instances:
                        config = config.model_copy(update={"instances": len(runtimes)})
                    break
                except (DeviceUnavailableError, UnsupportedModelError) as exc:
                    if plan.pinned:  # a pin is the user's choice: no fallback
                        raise
                    # The device is gone or refuses this model (an NPU compiler and a dynamic
                    # shape, a delegate that does not load): the profile's next candidate.
                    failed[plan.placement.describe()] = str(exc)
                    log.warning(
                        "placement failed to load: trying the next candidate",
                        extra={
                            "model": entry.name,
                            "version": version,
                            "placement": plan.placement.describe(),
                            "reason": str(exc),
                        },
                    )
                    plan = self.hardware.plan(entry.name, fmt, config.placement, failed)
            if steps is not None:
                try:
                    pipeline = await Pipeline.build(
                        steps,
                        version_dir,
                        runtimes[0].signature,
                        self.pipelines,
                        python_allowed=python_refusal(
                            steps, version_dir, self.pipelines, verified=verified
                        ),
                    )
                except BaseException:
                    for rt in runtimes:
                        rt.close()
                    raise
            load_s = time.monotonic() - started
        except Exception as exc:
            # Whatever went wrong, the version must not stay LOADING: it is UNAVAILABLE with
            # the reason, and the error raised is one the API and the start-up load expect.
            reason = str(exc) or repr(exc)
            # A version that was serving keeps its READY status; the failure is the new one's.
            if version in entry.served and previous is not None:
                entry.status[version] = previous
            else:
                entry.status[version] = VersionStatus(VersionState.UNAVAILABLE, reason)
            expected = isinstance(exc, (RuntimeFailure, AgentError))
            log.error(
                "version failed to load",
                exc_info=None if expected else exc,  # anything else is a bug: its traceback
                extra={"model": entry.name, "version": version, "reason": reason},
            )
            if isinstance(exc, MemoryBudgetError) or (
                isinstance(exc, AgentError) and not isinstance(exc, LoadError)
            ):
                raise  # as it is: MemoryBudgetError keeps its code (and its 409)
            raise LoadError(f"model {entry.name!r} version {version}: {reason}") from exc
        stats = VersionStats()
        observer: BatchObserver = stats.record_batch
        if self.metrics is not None:
            observer = self.metrics.batch_observer(entry.name, str(version), stats)
        kind: Callable[..., LoadedVersion] = LoadedVersion
        if pipeline is not None:
            kind = functools.partial(
                PipelineVersion, pipeline=pipeline, model_signature=runtimes[0].signature
            )
        lv = kind(
            model=entry.name,
            version=version,
            config=config,
            placement=plan.placement,
            format=fmt,
            model_file=model_file,
            signature=runtimes[0].signature if pipeline is None else pipeline.signature,
            batcher=Batcher(
                name,
                runtimes,
                config.batching if tuning is None else tuning.applied_to(config.batching),
                batched=batched,
                observer=observer,
                nice_offset=settings.compute_nice_offset,
                # ONNX Runtime's own sessions only: a call as long for the same shapes every
                # time (a wrapper around one may block the loop: the tests' gated runtimes)
                inline_max_s=INLINE_MAX_S
                if all(type(rt) is OnnxRuntimeBackend for rt in runtimes)
                else 0.0,
            ),
            memory_bytes=accounted_memory_bytes(version_dir, config, rss_added),
            load_s=load_s,
            stats=stats,
            tuning=tuning,
        )
        lv.batcher.start()
        if isinstance(lv, PipelineVersion):
            problem = await pipeline_self_test(
                lv, version_dir, self.model_caller(lv, 1, None), self.step_executor
            )
            if problem is not None:
                await lv.retire()
                if not (version in entry.served and previous is not None):
                    entry.status[version] = VersionStatus(VersionState.UNAVAILABLE, problem)
                log.error(
                    "version failed to load",
                    extra={"model": entry.name, "version": version, "reason": problem},
                )
                raise LoadError(f"model {entry.name!r} version {version}: {problem}")
        log.info(
            "version loaded",
            extra={
                "model": entry.name,
                "version": version,
                "placement": plan.placement.describe(),
                "load_s": round(load_s, 3),
            },
        )
        return lv

    async def _make_room(self, model: str, needed: int, name: str) -> None:
        budget = self.hardware.memory_budget_bytes
        if budget is None or self.used_memory_bytes() + needed <= budget:
            return
        victims = sorted(
            (
                e
                for e in self.models.values()
                if e.name != model
                and e.config.evictable
                and e.served
                and all(v.idle for v in e.served.values())
            ),
            key=lambda e: max(v.last_used for v in e.served.values()),
        )
        for entry in victims:
            log.warning("evicting idle model for memory", extra={"model": entry.name, "for": name})
            await self._unload(entry)
            if self.used_memory_bytes() + needed <= budget:
                return
        in_use = (
            ", ".join(
                f"{e.name} {sum(v.memory_bytes for v in e.served.values()) / 2**20:.0f} MiB"
                for e in self.models.values()
                if e.served
            )
            or "nothing"
        )
        raise MemoryBudgetError(
            f"loading {name} needs about {needed / 2**20:.0f} MiB but the memory budget of profile "
            f"{self.hardware.profile.name} is {budget / 2**20:.0f} MiB with "
            f"{self.used_memory_bytes() / 2**20:.0f} MiB in use ({in_use}); mark idle models "
            "evictable or raise the budget"
        )
