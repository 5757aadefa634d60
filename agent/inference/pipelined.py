"""A model version served as a pipeline (:class:`PipelineVersion`), and how its pipeline's
model steps call models through their batchers (:func:`model_caller`), sketched at its own
model (:func:`sketched`). The pipeline itself,
its steps and what loading one checks are :mod:`agent.pipelines`' own; that package needs
nothing of this one to run."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from agent.inference.batch_run import ItemResult
from agent.inference.versions import LoadedVersion
from agent.pipelines.errors import StepFailedError, StepInputError
from agent.pipelines.pipeline import ModelCall, Pipeline
from common.pipeline_config import ModelStep
from runtimes.errors import InvalidInputError
from runtimes.signature import ModelSignature

if TYPE_CHECKING:
    from agent.inference.sketches import InputSketchBook
    from agent.metrics import AgentMetrics


@dataclass(eq=False)
class PipelineVersion(LoadedVersion):
    """A version whose requests run through :attr:`pipeline`; :attr:`signature` is the
    pipeline's (what clients send and get), :attr:`model_signature` its own model's."""

    pipeline: Pipeline | None = None
    model_signature: ModelSignature | None = None

    @property
    def platform(self) -> str:
        # Triton's name for a model made of steps; the own model's runtime is in placement
        return "ensemble"

    async def retire(self) -> None:
        try:
            await super().retire()
        finally:
            if self.pipeline is not None:
                await self.pipeline.close()


async def call_model(
    step: str,
    target: LoadedVersion,
    signature: ModelSignature,
    inputs: dict[str, np.ndarray],
    *,
    priority: int,
    timeout_s: float | None,
) -> ItemResult:
    """Run a model step's inputs through ``target``'s batcher, checked first so that a bad
    request never fails the batch it would join. ``priority`` 0 is the target's default."""
    try:
        rows = signature.validate_inputs(inputs)
    except InvalidInputError as exc:
        raise StepInputError(f"step {step}: {exc}", field=step) from None
    batching = target.config.batching
    level = min(priority, batching.priority_levels) if priority else batching.default_priority
    target.acquire()
    try:
        return await target.batcher.infer(inputs, rows or 1, priority=level, timeout_s=timeout_s)
    finally:
        target.release()


def model_caller(
    lv: PipelineVersion,
    resolve: Callable[[str, str | None], LoadedVersion],
    metrics: AgentMetrics | None,
    priority: int,
    timeout_s: float | None,
) -> ModelCall:
    """How ``lv``'s pipeline calls models: its own, or another served model by name (an
    ensemble), each through that model's batcher; a called model counts the call in its own
    statistics."""

    async def call(name: str, step: ModelStep, inputs: dict[str, np.ndarray]) -> ItemResult:
        if not step.model:
            assert lv.model_signature is not None  # bound only where there is a model file
            return await call_model(
                name, lv, lv.model_signature, inputs, priority=priority, timeout_s=timeout_s
            )
        target = resolve(step.model, step.version or None)
        if isinstance(target, PipelineVersion):
            raise StepFailedError(f"step {name}: model {step.model!r} is a pipeline itself")
        started = time.monotonic()
        result = await call_model(
            name, target, target.signature, inputs, priority=priority, timeout_s=timeout_s
        )
        total = time.monotonic() - started
        target.stats.record_success(total, result.queue_s, result.compute_s)
        if metrics is not None:
            version = str(target.version)
            metrics.observe_success(target.model, version, total, result.queue_s, result.compute_s)
        return result

    return call


def sketched(call: ModelCall, sketches: InputSketchBook, lv: PipelineVersion) -> ModelCall:
    """``call``, with the tensors entering and leaving ``lv``'s own model step sketched under
    the pipeline's name and version: drift is judged at the model, where the control plane
    makes the version's reference (through the same steps). Other models an ensemble calls
    are not the pipeline's, and a JPEG's bytes have no distribution worth sketching."""

    async def call_sketched(
        name: str, step: ModelStep, inputs: dict[str, np.ndarray]
    ) -> ItemResult:
        result = await call(name, step, inputs)
        if not step.model:
            sketches.observe(lv.model, lv.version, inputs, result.outputs)
        return result

    return call_sketched
