"""Build a version's optimised variants from its FP32 ONNX variant (blocking; run in a thread).

The new variants are ordinary variants of the version (format, profiles, files, signature) with
an ``optimisation`` record: kind, source variant, and the numbers they were judged by. A device
of one of their profiles is sent them (``ModelManifest.variant_for``); others keep the FP32 one.
A profile that already has a pushed variant is left to it. Building again replaces the variants
built before.

The version's golden sample expects FP32 answers within 1e-4, which an INT8 model does not give:
a built variant carries its own ``golden.npz`` among its files (the same inputs, its own answers,
a tolerance as wide as its distance from FP32 on them), and the manifest then sends every
variant its golden as one of its files (:func:`control_plane.rollouts.manifests.build_manifest`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from common.pipeline_config import PIPELINE_FILES
from control_plane.errors import Invalid
from control_plane.quality.optimise import (
    Outcome,
    VariantKind,
    build_fp16,
    build_int8,
    build_openvino_int8,
    judge,
    missing_tool,
    profiles_for,
    refusal,
    run_model,
)
from control_plane.quality.reference import ReferenceSet, load_reference
from control_plane.registry.store import ArtifactStore, read_signature
from runtimes.golden import GOLDEN_FILE, GoldenSample

_BUILDERS: dict[VariantKind, Callable[..., None]] = {
    VariantKind.INT8: build_int8,
    VariantKind.FP16: lambda source, target, _reference: build_fp16(source, target),
    VariantKind.OPENVINO_INT8: build_openvino_int8,
}


def _own_golden(
    store: ArtifactStore, golden: dict[str, Any], fp32_file: Path, variant_file: Path
) -> dict[str, Any]:
    """The version's golden inputs with the variant's own answers, stored; its file entry."""
    sample = GoldenSample.load(store.path(golden["sha256"]))
    rows = ReferenceSet(sample.inputs, None, sample.outputs)
    fp32, mine = run_model(fp32_file, rows), run_model(variant_file, rows)
    spread = max(float(np.max(np.abs(mine[k] - fp32[k]))) for k in sample.outputs if k in mine)
    path = variant_file.with_name(GOLDEN_FILE)
    outputs = {k: mine[k] for k in sample.outputs if k in mine}
    # as far from its own answers as it is from FP32's: wide enough for another CPU's integer
    # kernels, narrow enough to catch a corrupt or wrong model
    GoldenSample(sample.inputs, outputs, rtol=0.0, atol=max(1e-3, spread)).save(path)
    sha, size = store.put_file(path)
    return {"name": GOLDEN_FILE, "sha256": sha, "size": size}


def source_index(variants: list[dict[str, Any]]) -> int:
    """The pushed ONNX variant the optimised ones are built from (a generic one first)."""
    pushed = [(i, v) for i, v in enumerate(variants) if not v.get("optimisation")]
    onnx = [(i, v) for i, v in pushed if v["format"] == "onnx"]
    if not onnx:
        raise Invalid("optimise: the version has no ONNX variant to build variants from")
    return next((i for i, v in onnx if not v["profiles"]), onnx[0][0])


def optimise(
    store: ArtifactStore,
    variants: list[dict[str, Any]],
    reference: dict[str, Any],
    golden: dict[str, Any] | None = None,
    *,
    max_accuracy_drop: float,
    kinds: tuple[VariantKind, ...] = tuple(VariantKind),
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Return (the version's new variant list, the report)."""
    pushed = [v for v in variants if not v.get("optimisation")]
    index = source_index(pushed)
    source = pushed[index]
    if any(PIPELINE_FILES.match(f["name"]) for f in source["files"]):
        # its pipeline_golden.npz expects the FP32 model's answers at the end of its steps
        raise Invalid("optimise: variants of a pipeline are not built (its golden is FP32's)")
    ref = load_reference(store.path(reference["sha256"]))
    taken = {p for v in pushed for p in v["profiles"]}
    results: list[dict[str, Any]] = []
    built: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        src_dir = Path(scratch) / "source"
        src_dir.mkdir()
        store.materialise(source["files"], src_dir)
        model_file = next(
            src_dir / f["name"] for f in source["files"] if f["name"].endswith(".onnx")
        )
        try:
            fp32 = run_model(model_file, ref)
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise Invalid(f"reference set does not run on the FP32 model: {exc}") from exc
        for kind in kinds:
            result: dict[str, Any] = {"kind": kind.value, "source_variant": index}
            results.append(result)
            profiles = [p for p in profiles_for(kind) if p not in taken]
            if not profiles:
                result.update(outcome=Outcome.UNAVAILABLE, reason="no profile left to serve")
                continue
            missing = missing_tool(kind)
            if missing is not None:
                result.update(outcome=Outcome.UNAVAILABLE, reason=missing)
                continue
            ir = kind is VariantKind.OPENVINO_INT8
            target = Path(scratch) / kind.value / ("model.xml" if ir else model_file.name)
            target.parent.mkdir()
            try:
                _BUILDERS[kind](model_file, target, ref)
                numbers = judge(fp32, run_model(target, ref), ref.labels)
            except Exception as exc:  # a converter or runtime failure refuses this kind only
                result.update(outcome=Outcome.REFUSED, reason=f"could not build or run: {exc}")
                continue
            result.update(numbers, profiles=profiles)
            why = refusal(numbers, max_accuracy_drop)
            if why is not None:
                result.update(outcome=Outcome.REFUSED, reason=why)
                continue
            files = [f for f in source["files"] if not f["name"].endswith(".onnx")]
            for made in [target, target.with_suffix(".bin")] if ir else [target]:
                sha, size = store.put_file(made)
                files.append({"name": made.name, "sha256": sha, "size": size})
            if golden is not None:
                try:
                    files.append(_own_golden(store, golden, model_file, target))
                except Exception as exc:  # a golden that does not fit the model, say
                    reason = f"its golden sample could not be made: {exc}"
                    result.update(outcome=Outcome.REFUSED, reason=reason)
                    continue
            fmt = "openvino_ir" if ir else "onnx"
            variant: dict[str, Any] = {"format": fmt, "profiles": profiles, "files": files}
            variant["signature"] = read_signature(store, variant)
            variant["optimisation"] = {k: v for k, v in result.items() if k != "profiles"}
            variant["optimisation"]["outcome"] = Outcome.BUILT.value
            result.update(outcome=Outcome.BUILT, variant=len(pushed) + len(built))
            built.append(variant)
    report = {
        "max_accuracy_drop": max_accuracy_drop,
        "reference_rows": ref.rows,
        "judged_by": "accuracy" if ref.labels is not None else "agreement",
        "results": [{k: str(v) if k == "outcome" else v for k, v in r.items()} for r in results],
        "optimised_at": datetime.now(UTC).isoformat(),
    }
    return pushed + built, report
