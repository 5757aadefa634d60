"""Validation of a model version before it may be rolled out (blocking; run in a thread).

A version passes when every variant loads on every runtime here that reads its format, its
golden sample matches on each, all (variant, runtime) pairs give the same answers within
tolerance, and, when a labelled validation set was uploaded, its accuracy is not more than
``margin`` below the production version's. A variant with a pipeline (``pipeline.toml`` and
``pipeline_golden.npz`` among its files) passes only if its golden request (a JPEG, say) runs
through the whole pipeline on each runtime to the expected answer. An optimised variant (INT8,
FP16: :mod:`control_plane.quality`) must load and run; its answers were judged on the reference
set when it was built.
"""

from __future__ import annotations

import tempfile
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from common.pipeline_config import (
    PIPELINE_FILE,
    PIPELINE_GOLDEN_FILE,
    PipelineConfigError,
    parse_pipeline,
)
from common.pipeline_steps import StepError, run_offline
from control_plane.registry.generative import validate_generative
from control_plane.registry.pipeline_reference import model_step_reference
from control_plane.registry.store import ArtifactStore
from runtimes.backends import BACKENDS, open_model
from runtimes.base import Placement, Runtime
from runtimes.datatypes import numpy_dtype
from runtimes.errors import ModelFileError, RuntimeFailure
from runtimes.formats import GENAI_FORMAT, find_model_file
from runtimes.golden import GoldenSample
from runtimes.inventory import probe_runtimes


def _placement(runtime: str) -> Placement:
    providers = ("CPUExecutionProvider",) if runtime == "onnxruntime" else ()
    return Placement(runtime=runtime, providers=providers)  # type: ignore[arg-type]


def _probe_inputs(runtime: Runtime) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    inputs = {}
    for spec in runtime.signature.inputs:
        shape = [2 if d < 0 else d for d in spec.shape]
        inputs[spec.name] = rng.standard_normal(shape).astype(numpy_dtype(spec.datatype))
    return inputs


def validate(
    store: ArtifactStore,
    variants: list[dict[str, Any]],
    golden: dict[str, Any] | None,
    validation_data: dict[str, Any] | None,
    production_accuracy: float | None,
    *,
    rtol: float,
    atol: float,
    margin: float,
    reference: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every variant and judge it; ``reference``: the version's reference set, whose
    labels (where it has them) give ``reference_accuracy``, what live accuracy is judged
    against (concept drift)."""
    checks: list[dict[str, Any]] = []

    def check(name: str, passed: bool, detail: str = "") -> None:
        checks.append({"check": name, "passed": passed, "detail": detail})

    inventory = probe_runtimes()
    golden_sample = None
    if golden:
        try:
            golden_sample = GoldenSample.load(store.path(golden["sha256"]))
        except ModelFileError as exc:  # an upload is anything its uploader sent
            check("golden sample is readable", False, str(exc))
    outputs: list[tuple[str, dict[str, np.ndarray]]] = []
    first: Runtime | None = None
    probe: dict[str, np.ndarray] | None = golden_sample.inputs if golden_sample else None
    generative_ran = False
    model_reference: dict[str, Any] | None = None  # a pipeline's, at its model step
    with tempfile.TemporaryDirectory() as scratch:
        for i, variant in enumerate(variants):
            if not variant["files"]:
                check(f"variant {i} ({variant['format']}) has files", False, "no files uploaded")
                continue
            directory = Path(scratch) / str(i)
            directory.mkdir()
            if variant["format"] == GENAI_FORMAT:
                store.materialise(variant["files"], directory)
                generative_ran |= validate_generative(directory, f"variant {i} (genai)", check)
                continue
            try:
                model_file, fmt = find_model_file(store.materialise(variant["files"], directory))
            except RuntimeFailure as exc:
                check(f"variant {i} ({variant['format']}) has a model file", False, str(exc))
                continue
            runtimes = [n for n, cls in BACKENDS.items() if fmt in cls.formats]
            if variant.get("optimisation"):
                # built for one runtime (ORT's QLinear/QGemm operators are its own)
                runtimes = ["openvino" if fmt.value == "openvino_ir" else "onnxruntime"]
            for runtime_name in runtimes:
                label = f"variant {i} ({fmt.value}) on {runtime_name}"
                if not inventory.get(runtime_name).installed:
                    check(
                        f"{label} loads",
                        False,
                        f"{runtime_name} is not installed on the control plane",
                    )
                    continue
                try:
                    runtime = open_model(model_file, _placement(runtime_name))
                except RuntimeFailure as exc:
                    check(f"{label} loads", False, str(exc))
                    continue
                check(f"{label} loads", True)
                if (directory / PIPELINE_FILE).is_file():
                    problems = _pipeline_problems(directory, runtime)
                    passed = not problems
                    check(f"{label} passes its pipeline's golden", passed, "; ".join(problems))
                    if reference is not None and model_reference is None:
                        made = _model_reference(store, directory, runtime, reference)
                        problem = made.pop("problem", "")
                        model_reference = made or None
                        check(f"the reference set runs through {label}", not problem, problem)
                if probe is None:
                    probe = _probe_inputs(runtime)
                try:
                    out = runtime.infer(probe)
                except RuntimeFailure as exc:
                    check(f"{label} runs", False, str(exc))
                    runtime.close()
                    continue
                if variant.get("optimisation"):
                    # an INT8/FP16 variant is judged on the reference set, when it was built
                    # (control_plane.quality), not by the FP32 golden's tolerance
                    runtime.close()
                    continue
                if golden_sample is not None:
                    problems = golden_sample.mismatches(out)
                    check(f"{label} passes its golden self-test", not problems, "; ".join(problems))
                outputs.append((label, out))
                if first is None:
                    first = runtime
                else:
                    runtime.close()
        for label, out in outputs[1:]:
            ref_label, ref = outputs[0]
            worst = max(
                float(np.max(np.abs(out[k].astype(np.float64) - ref[k]))) for k in ref if k in out
            )
            agree = all(k in out and np.allclose(out[k], ref[k], rtol=rtol, atol=atol) for k in ref)
            check(f"{label} agrees with {ref_label}", agree, f"largest difference {worst:.3g}")
        accuracy = None
        if validation_data is not None and first is not None:
            try:
                accuracy = _accuracy(first, store.path(validation_data["sha256"]))
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
                check("validation set is readable", False, str(exc))
            except RuntimeFailure as exc:
                check("validation set runs", False, str(exc))
        if accuracy is not None:
            if production_accuracy is not None:
                ok = accuracy >= production_accuracy - margin
                check(
                    "accuracy against production",
                    ok,
                    f"{accuracy:.4f} vs production {production_accuracy:.4f} (margin {margin})",
                )
            else:
                check(
                    "accuracy recorded", True, f"{accuracy:.4f} (no production version to compare)"
                )
        reference_accuracy = None
        if reference is not None and first is not None:
            judged = model_reference or reference  # a pipeline's model takes tensors
            reference_accuracy = _labelled_accuracy(first, store.path(judged["sha256"]))
        if first is not None:
            first.close()
    if not outputs and not generative_ran:
        check("at least one variant runs", False, "nothing could be run")
    return {
        "passed": all(c["passed"] for c in checks),
        "checks": checks,
        "accuracy": accuracy,
        "reference_accuracy": reference_accuracy,
        "model_reference": model_reference,
        "validated_at": datetime.now(UTC).isoformat(),
    }


def _pipeline_problems(directory: Path, runtime: Runtime) -> list[str]:
    """Why the variant's pipeline_golden.npz does not come out of its pipeline, run with
    ``runtime`` as its own model; empty when it does."""
    golden_path = directory / PIPELINE_GOLDEN_FILE
    if not golden_path.is_file():
        return [f"the variant has {PIPELINE_FILE} but no {PIPELINE_GOLDEN_FILE}"]
    try:
        steps = parse_pipeline((directory / PIPELINE_FILE).read_text(), PIPELINE_FILE)
        golden = GoldenSample.load(golden_path)
        outputs = run_offline(steps, directory, golden.inputs, runtime.signature, runtime.infer)
    except (PipelineConfigError, StepError, RuntimeFailure, ValueError, OSError) as exc:
        return [str(exc)]
    return golden.mismatches(outputs)


def _model_reference(
    store: ArtifactStore, directory: Path, runtime: Runtime, reference: dict[str, Any]
) -> dict[str, Any]:
    """The pipeline's drift reference at its model step (stored), or ``{"problem": why}``."""
    try:
        return model_step_reference(store, directory, runtime, reference)
    except (PipelineConfigError, StepError, RuntimeFailure, ValueError, OSError, KeyError) as exc:
        return {"problem": str(exc)}


def _labelled_accuracy(runtime: Runtime, path: Path) -> float | None:
    """:func:`_accuracy` on a reference set; None where it has no labels, or the model cannot
    run it (the checks above judge the model; this only records a number)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if "labels" not in data.files:
                return None
        return _accuracy(runtime, path)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, RuntimeFailure):
        return None


def _accuracy(runtime: Runtime, path: Path) -> float:
    """Share of rows whose arg-max output equals the label (npz: ``input:<name>``, ``labels``)."""
    with np.load(path, allow_pickle=False) as data:
        inputs = {k[6:]: data[k] for k in data.files if k.startswith("input:")}
        labels = data["labels"]
    out = next(iter(runtime.infer(inputs).values()))
    return float(np.mean(np.argmax(out.reshape(len(labels), -1), axis=1) == labels))
