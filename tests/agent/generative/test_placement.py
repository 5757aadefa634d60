"""A generative model is placed by the hardware profile like any ONNX model (ONNX Runtime
with the profile's execution provider), and a device that fails it is a recorded load
failure, never a crashed start-up."""

from __future__ import annotations

from pathlib import Path

from runtimes.base import Placement, Runtime
from runtimes.errors import DeviceUnavailableError
from runtimes.settings import RuntimeSettings
from tests.agent.generative.conftest import Loaded
from tests.agent.server import serve


def test_the_profile_places_it_on_onnx_runtime(lm: Loaded) -> None:
    placement = lm.models.resolve("tiny-lm").placement
    assert placement.runtime == "onnxruntime"
    assert placement.providers and placement.providers[-1] == "CPUExecutionProvider"


def no_device(model_file: Path, placement: Placement, settings: RuntimeSettings) -> Runtime:
    raise DeviceUnavailableError(f"{placement.describe()} is gone")


def test_a_device_that_fails_leaves_the_model_unavailable_with_the_reason(
    lm_repository: Path, tmp_path: Path
) -> None:
    with serve(lm_repository, runtime_factory=no_device) as agent:
        rows = agent.client.get("/v2/repository/index").json()
        (row,) = [r for r in rows if r["name"] == "tiny-lm"]
        assert row["state"] == "UNAVAILABLE" and "is gone" in row["reason"]
        answer = agent.client.post("/v1/completions", json={"model": "tiny-lm", "prompt": "a"})
        assert answer.status_code == 503 and "is gone" in answer.json()["error"]["message"]
        assert agent.client.get("/v2/health/live").status_code == 200
        assert agent.client.get("/v2/health/ready").status_code == 503  # strict readiness
