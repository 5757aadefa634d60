"""The control plane takes a pipeline's files with the model's and validates the version as
it validates a model: the golden JPEG runs through the whole pipeline on each runtime."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtimes.examples.classifier import write_classifier
from runtimes.golden import GoldenSample
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.mqtt_broker import Mosquitto, free_port

PIPELINE_FILES = ("pipeline.toml", "labels.txt", "pipeline_golden.npz")


@pytest.fixture
def cp(tmp_path: Path) -> Iterator[RunningControlPlane]:
    broker = Mosquitto(tmp_path / "broker").start()
    try:
        db = f"sqlite+aiosqlite:///{tmp_path}/cp.db"
        with control_plane(tmp_path / "cp", db, broker.url, free_port()) as running:
            yield running
    finally:
        broker.stop()


def _push(cp: RunningControlPlane, version: int, directory: Path) -> dict[str, Any]:
    spec = {"version": version, "variants": [{"format": "onnx"}]}
    created = cp.admin.post("/api/v1/models/classifier/versions", json=spec)
    assert created.status_code == 201, created.text
    # the pipeline's files first: the model file completes the variant
    for name in (*PIPELINE_FILES, "model.onnx"):
        url = f"/api/v1/models/classifier/versions/{version}/variants/0/files/{name}"
        uploaded = cp.admin.put(url, content=(directory / name).read_bytes())
        assert uploaded.status_code == 200, uploaded.text
    validated = cp.admin.post(f"/api/v1/models/classifier/versions/{version}/validate")
    assert validated.status_code == 200, validated.text
    report: dict[str, Any] = validated.json()
    return report


@pytest.mark.slow
def test_a_pipeline_is_validated_end_to_end_on_each_runtime(
    cp: RunningControlPlane, tmp_path: Path
) -> None:
    good = tmp_path / "good"
    good.mkdir()
    write_classifier(good)
    report = _push(cp, 1, good)
    pipeline_checks = [c for c in report["checks"] if "pipeline's golden" in c["check"]]
    assert pipeline_checks and all(c["passed"] for c in pipeline_checks), report
    assert "on onnxruntime" in pipeline_checks[0]["check"]
    assert report["passed"], report
    files = cp.admin.get("/api/v1/models/classifier/versions/1").json()["variants"][0]["files"]
    assert {f["name"] for f in files} == {*PIPELINE_FILES, "model.onnx"}  # all in the manifest

    bad = tmp_path / "bad"  # the same files, a golden that expects other labels
    bad.mkdir()
    write_classifier(bad)
    golden = GoldenSample.load(bad / "pipeline_golden.npz")
    labels = golden.outputs["labels"][:, ::-1].copy()
    GoldenSample(golden.inputs, {**golden.outputs, "labels": labels}).save(
        bad / "pipeline_golden.npz"
    )
    report = _push(cp, 2, bad)
    failed = [c for c in report["checks"] if not c["passed"]]
    assert not report["passed"]
    assert failed and "pipeline's golden" in failed[0]["check"]
    assert "output 'labels' differs" in failed[0]["detail"]


def test_other_files_are_still_refused(cp: RunningControlPlane) -> None:
    spec = {"version": 1, "variants": [{"format": "onnx"}]}
    assert cp.admin.post("/api/v1/models/classifier/versions", json=spec).status_code == 201
    url = "/api/v1/models/classifier/versions/1/variants/0/files/run.sh"
    refused = cp.admin.put(url, content=b"#!/bin/sh\n")
    assert refused.status_code == 400 and "pipeline.toml" in refused.text


@pytest.mark.slow
def test_cli_push_takes_the_pipelines_files(cp: RunningControlPlane, tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    write_classifier(tmp_path / "v1")
    exe = Path(sys.executable).parent / "edgefleet"
    env = {**os.environ, "EDGEFLEET_URL": cp.url, "EDGEFLEET_TOKEN": cp.token("operator")}
    pushed = subprocess.run(
        [str(exe), "models", "push", "classifier", "1", str(tmp_path / "v1")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert pushed.returncode == 0, pushed.stderr
    files = cp.admin.get("/api/v1/models/classifier/versions/1").json()["variants"][0]["files"]
    assert {f["name"] for f in files} == {*PIPELINE_FILES, "model.onnx"}
    validated = cp.admin.post("/api/v1/models/classifier/versions/1/validate").json()
    assert validated["passed"], validated
