"""What loading a version served as a pipeline adds to a plain version: its pipeline's
config, whether its Python steps may run, its self-test. The version itself, and how its
pipeline calls models, are the inference service's (:mod:`agent.inference.pipelined`)."""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING

from agent.errors import AgentError
from agent.pipelines.errors import StepError
from agent.pipelines.pipeline import ModelCall
from agent.pipelines.settings import PipelineSettings, PythonSteps
from common.model_config import ModelConfig
from common.pipeline_config import (
    PIPELINE_FILE,
    PIPELINE_GOLDEN_FILE,
    PipelineConfig,
    PipelineConfigError,
    PythonStep,
    parse_pipeline,
)
from runtimes.errors import ModelFileError, RuntimeFailure
from runtimes.golden import GoldenSample

if TYPE_CHECKING:  # the inference service builds on pipelines, not the other way round
    from agent.inference.pipelined import PipelineVersion

DIGESTS_FILE = ".digests.json"
"""What the fleet store records at an install (agent.fleet.store): file name -> sha256."""


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
