"""A placement that fails to load falls back to the profile's next candidate: here a TFLite
"GPU delegate" that is a real library but not a delegate (libm), as a Jetson's C-API GPU
delegate or an EdgeTPU without its USB stack would be. A pinned placement does not fall back."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent.server import copy_models, serve
from tests.runtimes.fake_machines import MACHINES

PROFILE = """
name = "gpu-delegate-box"
description = "a board whose GPU delegate library loads but is not a working delegate"
priority = 100
[match]
architectures = ["x86_64"]
[[preferences.onnx]]
runtime = "onnxruntime"
providers = ["CPUExecutionProvider"]
[[preferences.tflite]]
runtime = "litert"
device = "GPU"
delegate = "libm.so.6"
[[preferences.tflite]]
runtime = "litert"
device = "CPU"
"""


def _setup(example_repo: Path, tmp_path: Path, config: str = "") -> dict[str, object]:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "box.toml").write_text(PROFILE)
    root = MACHINES["generic-x86_64"].build(tmp_path / "root")
    configs = {"mlp_tflite": config} if config else None
    repo = copy_models(example_repo, tmp_path / "repo", "mlp_tflite", configs=configs)
    return {"repository": repo, "profiles_dir": profiles, "hardware_root": root}


def test_a_delegate_that_does_not_load_falls_back_to_the_next_candidate(
    example_repo: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup = _setup(example_repo, tmp_path)
    with serve(setup.pop("repository"), **setup) as agent:  # type: ignore[arg-type]
        metadata = agent.client.get("/v2/models/mlp_tflite").json()
        assert metadata["parameters"]["placement"] == "litert CPU", metadata
        spec = metadata["inputs"][0]
        shape, data = [1, *spec["shape"][1:]], [0.5] * spec["shape"][1]
        tensor = {"name": spec["name"], "datatype": "FP32", "shape": shape, "data": data}
        body = {"inputs": [tensor]}
        assert agent.client.post("/v2/models/mlp_tflite/infer", json=body).status_code == 200
    failed = [r for r in caplog.records if r.getMessage().startswith("placement failed")]
    assert [r.placement for r in failed] == ["litert GPU via libm.so.6"]  # type: ignore[attr-defined]
    assert "libm.so.6" in failed[0].reason  # type: ignore[attr-defined]


def test_a_pinned_placement_that_does_not_load_does_not_fall_back(
    example_repo: Path, tmp_path: Path
) -> None:
    setup = _setup(example_repo, tmp_path, '[placement]\nruntime = "litert"\ndevice = "GPU"\n')
    with serve(setup.pop("repository"), wait_ready=False, **setup) as agent:  # type: ignore[arg-type]
        index = agent.client.post("/v2/repository/index", json={}).json()
    (entry,) = index
    assert entry["state"] == "UNAVAILABLE" and "libm.so.6" in entry["reason"], entry
