"""A pipeline's golden sample run outside a serving agent (``edgefleet models selftest``):
its own model called on a runtime directly, one step after the other."""

from __future__ import annotations

from pathlib import Path

from agent.pipelines.version import pipeline_config
from common.model_config import ModelConfig
from common.pipeline_config import PIPELINE_GOLDEN_FILE, PipelineConfigError
from common.pipeline_steps import StepError, run_offline
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
    ``runtime`` (its own model loaded); empty when it does."""
    path = version_dir / PIPELINE_GOLDEN_FILE
    if not path.is_file():
        return [f"no {PIPELINE_GOLDEN_FILE}"]
    try:
        steps = pipeline_config(version_dir, config)
        assert steps is not None  # asked only of a version with a pipeline
        golden = GoldenSample.load(path)
        outputs = run_offline(steps, version_dir, golden.inputs, runtime.signature, runtime.infer)
    except (StepError, RuntimeFailure, PipelineConfigError, ValueError) as exc:
        return [str(exc)]
    return golden.mismatches(outputs)
