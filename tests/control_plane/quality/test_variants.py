"""Reference sets and optimised variants, through a real control plane, CLI and ONNX Runtime."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from control_plane.db.models import Model, ModelVersion
from control_plane.rollouts.manifests import build_manifest
from runtimes.backends import open_model
from runtimes.base import Placement
from runtimes.golden import GoldenSample
from tests.control_plane.quality.conftest import edgefleet
from tests.control_plane.server import RunningControlPlane

CPU_PROFILES = "generic-arm64,generic-x86_64,google-coral,raspberry-pi-5"


@pytest.mark.slow
def test_push_with_reference_builds_judged_variants_per_profile(
    cp: RunningControlPlane, examples: Path, tmp_path: Path
) -> None:
    version_dir = examples / "digits/1"
    pushed = edgefleet(
        cp,
        "models",
        "push",
        "digits",
        "1",
        str(version_dir),
        "--reference",
        str(version_dir / "reference.npz"),
    )
    assert pushed.returncode == 0, pushed.stderr
    out = pushed.stdout
    assert "uploaded" in out and "(reference set)" in out
    assert f"int8: built as variant 1 for {CPU_PROFILES}; accuracy " in out, out
    assert "fp16: built as variant 2 for nvidia-gpu,nvidia-jetson-orin" in out, out
    assert "openvino_int8: built as variant 3 for intel-core-ultra" in out, out

    doc = cp.admin.get("/api/v1/models/digits/versions/1").json()
    assert doc["reference"]["name"] == "reference.npz"
    int8 = doc["variants"][1]
    assert int8["profiles"] == CPU_PROFILES.split(",") and int8["signature"]
    judged = int8["optimisation"]
    assert judged["kind"] == "int8" and judged["rows"] == 360
    # the trained classifier: FP32 is right on ~97 % of the held-out digits, INT8 within 1 point
    assert judged["accuracy_fp32"] > 0.95
    assert abs(judged["accuracy_delta"]) <= 0.01
    assert 0 < judged["max_abs_diff"] < 1.0
    assert doc["variants"][0]["files"][0]["sha256"] != int8["files"][0]["sha256"]

    listed = edgefleet(cp, "models", "list").stdout
    assert "digits: v1 candidate" in listed
    assert f"v1 variant 1: int8 for {CPU_PROFILES}: accuracy " in listed, listed
    assert "v1 variant 2: fp16 for nvidia-gpu,nvidia-jetson-orin: accuracy +0.00 points" in listed

    # the built variants load and run in validation; the FP32 one still meets its golden
    checked = edgefleet(cp, "models", "validate", "digits", "1")
    assert checked.returncode == 0, checked.stdout
    assert "variant 1 (onnx) on onnxruntime loads" in checked.stdout
    assert "variant 3 (openvino_ir) on openvino loads" in checked.stdout
    _each_variant_gets_the_golden_sample_of_what_it_serves(cp, doc, tmp_path)


def _each_variant_gets_the_golden_sample_of_what_it_serves(
    cp: RunningControlPlane, doc: dict[str, Any], tmp_path: Path
) -> None:
    mv = ModelVersion(
        version=1, variants=doc["variants"], golden=doc["golden"], config={}, health={}
    )
    mv.model = Model(name="digits")
    now = datetime.now(UTC)
    manifest = build_manifest(mv, sequence=1, base_url=cp.url, rollout_id=None, now=now, ttl_s=60)
    assert manifest.golden is None  # each variant carries its own
    cases = [
        ("generic-x86_64", "int8", "model.onnx", "onnxruntime"),
        ("intel-core-ultra", "openvino_int8", "model.xml", "openvino"),
        ("some-other-box", "fp32", "model.onnx", "onnxruntime"),
    ]
    for profile, kind, model_name, runtime in cases:
        variant = manifest.variant_for(profile, {"onnx"})
        assert variant is not None
        directory = tmp_path / kind
        directory.mkdir()
        for ref in variant.files:
            content = cp.admin.get(f"/artifacts/sha256/{ref.sha256}").content
            (directory / ref.name).write_bytes(content)
        golden = GoldenSample.load(directory / "golden.npz")
        model = open_model(directory / model_name, Placement(runtime=runtime))
        try:
            assert golden.mismatches(model.infer(golden.inputs)) == [], kind
        finally:
            model.close()
        if kind != "fp32":
            assert golden.atol >= 1e-3  # the FP32 golden's 1e-4 would refuse INT8's answers


@pytest.mark.slow
def test_a_variant_past_the_threshold_is_refused_with_its_numbers(
    cp: RunningControlPlane, examples: Path, tmp_path: Path
) -> None:
    # One row of outliers among the calibration rows (the first 256) stretches the INT8 input range until the
    # real digits (pixels in [0, 1]) all quantise to nearly the same few values.
    with np.load(examples / "digits/1/reference.npz") as data:
        x, labels = data["input:input"], data["labels"]
    reference = tmp_path / "outlier.npz"
    np.savez(
        reference,
        **{"input:input": np.concatenate([np.full((1, 64), 500.0, np.float32), x])},
        labels=np.concatenate([[0], labels]),
    )
    pushed = edgefleet(
        cp,
        "models",
        "push",
        "digits",
        "2",
        str(examples / "digits/1"),
        "--reference",
        str(reference),
        "--max-accuracy-drop",
        "0.01",
    )
    assert pushed.returncode == 0, pushed.stderr
    refused = next(line for line in pushed.stdout.splitlines() if line.startswith("int8:"))
    assert refused.startswith("int8: refused: accuracy "), refused
    assert "over the limit of 1.00" in refused
    report = cp.admin.get("/api/v1/models/digits/versions/2").json()["optimisation"]
    int8 = next(r for r in report["results"] if r["kind"] == "int8")
    assert int8["outcome"] == "refused" and int8["accuracy_delta"] < -0.01
    variants = cp.admin.get("/api/v1/models/digits/versions/2").json()["variants"]
    kinds = [v.get("optimisation", {}).get("kind", "fp32") for v in variants]
    assert kinds == ["fp32", "fp16", "openvino_int8"]  # NNCF's ranges shrug off one outlier


@pytest.mark.slow
def test_agreement_judges_a_model_without_labels_and_optimize_rebuilds(
    cp: RunningControlPlane, examples: Path
) -> None:
    version_dir = examples / "mlp/1"
    pushed = edgefleet(
        cp,
        "models",
        "push",
        "mlp",
        "1",
        str(version_dir),
        "--reference",
        str(version_dir / "reference.npz"),
        "--no-optimise",
    )
    assert pushed.returncode == 0, pushed.stderr
    assert "int8:" not in pushed.stdout
    again = edgefleet(cp, "models", "optimize", "mlp", "1", "--max-accuracy-drop", "0.5")
    assert again.returncode == 0, again.stderr
    assert "int8: built as variant 1" in again.stdout and "agreement " in again.stdout
    doc = cp.admin.get("/api/v1/models/mlp/versions/1").json()
    assert doc["optimisation"]["judged_by"] == "agreement"
    assert doc["variants"][1]["optimisation"]["accuracy_delta"] is None
    # building again replaces the variants built before, it does not pile them up
    assert (
        edgefleet(cp, "models", "optimize", "mlp", "1", "--max-accuracy-drop", "0.5").returncode
        == 0
    )
    kinds = [
        v.get("optimisation", {}).get("kind", "fp32")
        for v in cp.admin.get("/api/v1/models/mlp/versions/1").json()["variants"]
    ]
    assert kinds == ["fp32", "int8", "fp16", "openvino_int8"], again.stdout
    assert "agreement " in edgefleet(cp, "models", "list").stdout


def test_bad_reference_sets_and_requests_are_refused_clearly(
    cp: RunningControlPlane, examples: Path, tmp_path: Path
) -> None:
    spec = {"version": 1, "variants": [{"format": "onnx"}]}
    assert cp.admin.post("/api/v1/models/plain/versions", json=spec).status_code == 201
    model = (examples / "digits/1/model.onnx").read_bytes()
    url = "/api/v1/models/plain/versions/1"
    assert cp.admin.put(f"{url}/variants/0/files/model.onnx", content=model).status_code == 200

    no_reference = cp.admin.post(f"{url}/optimise", json={})
    assert no_reference.status_code == 400 and "no reference set" in no_reference.text

    garbage = cp.admin.put(f"{url}/reference", content=b"not a zip")
    assert garbage.status_code == 400 and "not a readable .npz" in garbage.text
    buffer = io.BytesIO()
    np.savez(buffer, **{"input:input": np.zeros((4, 64), np.float32)})
    unlabelled = cp.admin.put(f"{url}/reference", content=buffer.getvalue())
    assert unlabelled.status_code == 400 and "needs labels or output" in unlabelled.text
    buffer = io.BytesIO()
    np.savez(buffer, **{"input:input": np.zeros((4, 64), np.float32)}, labels=np.zeros(3, int))
    ragged = cp.admin.put(f"{url}/reference", content=buffer.getvalue())
    assert ragged.status_code == 400 and "number of rows" in ragged.text

    buffer = io.BytesIO()
    np.savez(buffer, **{"input:wrong": np.zeros((4, 64), np.float32)}, labels=np.zeros(4, int))
    assert cp.admin.put(f"{url}/reference", content=buffer.getvalue()).status_code == 200
    mismatched = cp.admin.post(f"{url}/optimise", json={"max_accuracy_drop": 0.01})
    assert mismatched.status_code == 400 and "does not run on the FP32 model" in mismatched.text
    too_loose = cp.admin.post(f"{url}/optimise", json={"max_accuracy_drop": 2})
    assert too_loose.status_code in (400, 422)

    # a golden sample that does not fit the model: the variants are refused, saying why
    reference = (examples / "digits/1/reference.npz").read_bytes()
    assert cp.admin.put(f"{url}/reference", content=reference).status_code == 200
    GoldenSample({"wrong": np.zeros((1, 64), np.float32)}, {"logits": np.zeros((1, 10))}).save(
        tmp_path / "golden.npz"
    )
    golden = (tmp_path / "golden.npz").read_bytes()
    assert cp.admin.put(f"{url}/golden", content=golden).status_code == 200
    report = cp.admin.post(f"{url}/optimise", json={"kinds": ["int8"]}).json()
    assert report["results"][0]["outcome"] == "refused", report
    assert "golden sample could not be made" in report["results"][0]["reason"]
