"""A pipeline's golden sample run outside a serving agent (``edgefleet models selftest``):
its own model called on a runtime directly, one step after the other."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from agent.errors import AgentError
from agent.inference.batch_run import ItemResult
from agent.pipelines.pipeline import Pipeline
from agent.pipelines.settings import PipelineSettings
from agent.pipelines.version import pipeline_config
from common.model_config import ModelConfig
from common.pipeline_config import (
    PIPELINE_GOLDEN_FILE,
    ModelStep,
    PipelineConfig,
    PipelineConfigError,
)
from runtimes.base import Runtime
from runtimes.errors import RuntimeFailure
from runtimes.golden import GoldenSample


def has_pipeline(version_dir: Path, config: ModelConfig) -> bool:
    try:
        return pipeline_config(version_dir, config) is not None
    except PipelineConfigError:
        return True  # a pipeline, and a broken one: the self-test says why


def pipeline_golden_problems(version_dir: Path, config: ModelConfig, runtime: Runtime) -> list[str]:
    """Why the version's pipeline_golden.npz does not come out of its pipeline on
    ``runtime`` (its own model loaded); empty when it does. Python steps do not run here."""
    path = version_dir / PIPELINE_GOLDEN_FILE
    if not path.is_file():
        return [f"no {PIPELINE_GOLDEN_FILE}"]
    try:
        steps = pipeline_config(version_dir, config)
        assert steps is not None  # asked only of a version with a pipeline
        golden = GoldenSample.load(path)
        outputs = asyncio.run(_run(steps, version_dir, runtime, golden.inputs))
    except (AgentError, RuntimeFailure, PipelineConfigError, ValueError) as exc:
        return [str(exc)]
    return golden.mismatches(outputs)


async def _run(
    steps: PipelineConfig, version_dir: Path, runtime: Runtime, inputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    settings = PipelineSettings()
    pipeline = await Pipeline.build(
        steps,
        version_dir,
        runtime.signature,
        settings,
        python_allowed="a self-test does not run Python steps",
    )

    async def call(name: str, step: ModelStep, given: dict[str, np.ndarray]) -> ItemResult:
        if step.model:
            raise ValueError(f"step {name}: calls model {step.model!r}, which only an agent serves")
        outputs = runtime.infer(given)
        return ItemResult(outputs, 0.0, 0.0, next(iter(given.values())).shape[0])

    with ThreadPoolExecutor(max_workers=1) as executor:
        try:
            return (await pipeline.run(inputs, call, executor)).outputs
        finally:
            await pipeline.close()
