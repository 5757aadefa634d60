"""A model version served as a pipeline, and what loading one adds to a plain version."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from agent.errors import AgentError
from agent.inference.batch_run import ItemResult
from agent.inference.versions import LoadedVersion
from agent.pipelines.errors import StepError, StepFailedError, StepInputError
from agent.pipelines.pipeline import ModelCall, Pipeline
from agent.pipelines.settings import PipelineSettings, PythonSteps
from common.model_config import ModelConfig
from common.pipeline_config import (
    PIPELINE_FILE,
    PIPELINE_GOLDEN_FILE,
    ModelStep,
    PipelineConfig,
    PipelineConfigError,
    PythonStep,
    parse_pipeline,
)
from runtimes.errors import InvalidInputError, ModelFileError, RuntimeFailure
from runtimes.golden import GoldenSample
from runtimes.signature import ModelSignature

if TYPE_CHECKING:
    from agent.metrics import AgentMetrics

DIGESTS_FILE = ".digests.json"
"""What the fleet store records at an install (agent.fleet.store): file name -> sha256."""


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


def pipeline_config(version_dir: Path, config: ModelConfig) -> PipelineConfig | None:
    """The version's own pipeline.toml, else the model config's ``[pipeline]``, else None.

    Raises:
        PipelineConfigError: pipeline.toml is unreadable or invalid.
    """
    path = version_dir / PIPELINE_FILE
    if path.is_file():
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PipelineConfigError(f"{path}: cannot read: {exc}") from exc
        return parse_pipeline(text, str(path))
    return config.pipeline


def python_refusal(
    config: PipelineConfig, version_dir: Path, settings: PipelineSettings, *, verified: bool
) -> str | None:
    """None when the pipeline's Python steps may run here, else why not (the rule of
    :class:`~agent.pipelines.settings.PythonSteps`)."""
    if not any(isinstance(s, PythonStep) for s in config.steps):
        return None
    match settings.python_steps:
        case PythonSteps.ANY:
            return None
        case PythonSteps.OFF:
            return "pipelines.python_steps is off"
    if verified or digests_match(version_dir):
        return None
    return (
        "pipelines.python_steps is 'verified' and this version was not delivered by a verified "
        "manifest"
    )


def digests_match(version_dir: Path) -> bool:
    """Every file of the directory is one the fleet installed, unchanged since."""
    try:
        recorded = json.loads((version_dir / DIGESTS_FILE).read_text())
        files = {p.name for p in version_dir.iterdir() if p.is_file() and p.name[0] != "."}
        if not isinstance(recorded, dict) or set(recorded) != files:
            return False
        return all(
            hashlib.sha256((version_dir / name).read_bytes()).hexdigest() == digest
            for name, digest in recorded.items()
        )
    except (OSError, ValueError):
        return False


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


async def pipeline_self_test(
    lv: PipelineVersion, version_dir: Path, call: ModelCall, executor: Executor
) -> str | None:
    """Run the version's pipeline_golden.npz through the whole pipeline; why it failed, or
    None (also when there is none and none is required)."""
    assert lv.pipeline is not None
    path = version_dir / PIPELINE_GOLDEN_FILE
    if not lv.config.warmup.golden or not path.is_file():
        if lv.config.warmup.require_golden and not path.is_file():
            return f"no {PIPELINE_GOLDEN_FILE} in {version_dir}, and warmup.require_golden is set"
        return None
    try:
        golden = GoldenSample.load(path)
        result = await lv.pipeline.run(golden.inputs, call, executor)
    except (AgentError, StepError, RuntimeFailure, ModelFileError) as exc:
        return f"pipeline self-test failed: {exc}"
    problems = golden.mismatches(result.outputs)
    return "pipeline self-test failed: " + "; ".join(problems) if problems else None
