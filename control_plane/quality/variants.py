"""Build a version's optimised variants from its FP32 ONNX variant (blocking; run in a thread).

The new variants are ordinary variants of the version (format, profiles, files, signature) with
an ``optimisation`` record: kind, source variant, and the numbers they were judged by. A device
of one of their profiles is sent them (``ModelManifest.variant_for``); others keep the FP32 one.
A profile that already has a pushed variant is left to it. Building again replaces the variants
built before.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from control_plane.errors import Invalid
from control_plane.quality.optimise import (
    Outcome,
    VariantKind,
    build_fp16,
    build_int8,
    fp16_available,
    judge,
    profiles_for,
    refusal,
    run_model,
)
from control_plane.quality.reference import load_reference
from control_plane.registry.store import ArtifactStore, read_signature

_BUILDERS: dict[VariantKind, Callable[..., None]] = {
    VariantKind.INT8: build_int8,
    VariantKind.FP16: lambda source, target, _reference: build_fp16(source, target),
}


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
    *,
    max_accuracy_drop: float,
    kinds: tuple[VariantKind, ...] = tuple(VariantKind),
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Return (the version's new variant list, the report)."""
    pushed = [v for v in variants if not v.get("optimisation")]
    index = source_index(pushed)
    source = pushed[index]
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
            if kind is VariantKind.FP16 and not fp16_available():
                result.update(
                    outcome=Outcome.UNAVAILABLE,
                    reason="onnxconverter-common is not installed on the control plane",
                )
                continue
            target = Path(scratch) / kind.value / model_file.name
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
            sha, size = store.put_file(target)
            files = [f for f in source["files"] if not f["name"].endswith(".onnx")]
            files.append({"name": model_file.name, "sha256": sha, "size": size})
            variant: dict[str, Any] = {"format": "onnx", "profiles": profiles, "files": files}
            variant["signature"] = read_signature(store, variant)
            variant["optimisation"] = {k: v for k, v in result.items() if k != "profiles"}
            variant["optimisation"]["outcome"] = Outcome.BUILT.value
            result.update(outcome=Outcome.BUILT, variant=len(pushed) + len(built), sha256=sha)
            built.append(variant)
    report = {
        "max_accuracy_drop": max_accuracy_drop,
        "reference_rows": ref.rows,
        "judged_by": "accuracy" if ref.labels is not None else "agreement",
        "results": [{k: str(v) if k == "outcome" else v for k, v in r.items()} for r in results],
        "optimised_at": datetime.now(UTC).isoformat(),
    }
    return pushed + built, report
