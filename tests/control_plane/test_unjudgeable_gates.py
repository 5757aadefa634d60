"""Gates the devices cannot feed are refused when the rollout is created, with the reason; a
drift gate with nothing judged waits like the other gates unless ``allow_unjudged`` says so
(it passed such a wave before). Real Mosquitto, control plane (SQLite and PostgreSQL) and agent."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from runtimes.examples.tiny_lm import write_tiny_lm
from runtimes.examples.variants import mlp_version
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory, RunningControlPlane
from tests.control_plane.test_operations import edgefleet
from tests.control_plane.test_rollouts import push, rollout, validate, wait_devices, wait_rollout


def _create(cp: RunningControlPlane, **spec: Any) -> Any:
    body = {"model": "mlp", "version": 2, "waves": ["100%"], "bake_time_s": 0.5, **spec}
    return cp.admin.post("/api/v1/rollouts", json=body)


def _reference(cp: RunningControlPlane, version_dir: Path, version: int) -> None:
    """A reference set for mlp: inputs and the model's own outputs."""
    session = ort.InferenceSession(str(version_dir / "model.onnx"))
    x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    buffer = io.BytesIO()
    np.savez(buffer, **{"input:input": x, "output:logits": session.run(None, {"input": x})[0]})
    url = f"/api/v1/models/mlp/versions/{version}/reference"
    assert cp.admin.put(url, content=buffer.getvalue()).status_code == 200


def test_a_drift_gate_without_a_reference_set_is_refused(
    start_control_plane: ControlPlaneFactory, tmp_path: Path
) -> None:
    with start_control_plane() as cp:
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        answer = _create(cp, gates={"max_drift": 0.2})
        assert answer.status_code == 400, answer.text
        assert "gates.max_drift: mlp v2 has no reference set" in answer.text


def test_a_shadow_of_a_pipeline_is_refused(
    start_control_plane: ControlPlaneFactory, example_repo: Path
) -> None:
    version_dir = example_repo / "classifier" / "1"
    with start_control_plane() as cp:
        spec = {"version": 1, "variants": [{"format": "onnx", "profiles": []}]}
        assert cp.admin.post("/api/v1/models/classifier/versions", json=spec).status_code == 201
        for name in ("pipeline.toml", "pipeline_golden.npz", "labels.txt", "model.onnx"):
            url = f"/api/v1/models/classifier/versions/1/variants/0/files/{name}"
            resp = cp.admin.put(url, content=(version_dir / name).read_bytes())
            assert resp.status_code == 200, resp.text
        answer = _create(cp, model="classifier", version=1, shadow={"min_requests": 10})
        assert answer.status_code == 400, answer.text
        assert "shadow: classifier v1 is a pipeline" in answer.text


def test_gates_a_generative_model_cannot_feed_are_refused_and_token_gates_elsewhere(
    start_control_plane: ControlPlaneFactory, tmp_path: Path
) -> None:
    with start_control_plane() as cp:
        folder = tmp_path / "tiny-lm"
        folder.mkdir()
        write_tiny_lm(folder, seed=4802)
        pushed = edgefleet(cp, cp.token("operator"), "models", "push", "tiny-lm", "2", str(folder))
        assert pushed.returncode == 0, pushed.stderr
        for refused, gate in (
            ({"shadow": {"min_requests": 10}}, "shadow"),
            ({"gates": {"max_drift": 0.2}}, "gates.max_drift"),
            ({"gates": {"max_accuracy_drop": 0.1}}, "gates.max_accuracy_drop"),
        ):
            answer = _create(cp, model="tiny-lm", **refused)
            assert answer.status_code == 400, answer.text
            assert f"{gate}: tiny-lm v2 is a generative model" in answer.text
        assert validate(cp.admin, "tiny-lm", 2)["passed"]
        gated = _create(cp, model="tiny-lm", gates={"max_ttft_p99_ms": 500})
        # its own gates are taken: what stops it is that no device is enrolled here (the
        # rollout itself: test_generative_rollouts.py)
        assert gated.status_code == 400 and "selector: no device" in gated.text, gated.text

        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        for gate in ("max_ttft_p99_ms", "max_inter_token_p99_ms"):
            answer = _create(cp, gates={gate: 100})
            assert answer.status_code == 400, answer.text
            assert f"gates.{gate}: mlp v2 is not a generative model" in answer.text


@pytest.mark.slow
def test_a_drift_gate_with_nothing_judged_waits_unless_allowed(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    with start_control_plane() as cp, start_agent("dev-a", cp):
        wait_devices(cp, "dev-a")
        for version in (2, 3):
            version_dir = mlp_version(tmp_path / f"v{version}", seed=version)
            push(cp.admin, "mlp", version, [(version_dir, [])])
            _reference(cp, version_dir, version)
            validate(cp.admin, "mlp", version)
        # no traffic: the error gates are asked for none (min_requests 0), drift sees nothing
        gates = {"max_drift": 1.0, "min_requests": 0, "allow_unjudged": False}
        waiting = rollout(cp, 2, waves=["100%"], gates=gates)
        wait_until(
            lambda: (
                cp.admin.get(f"/api/v1/rollouts/{waiting}")
                .json()["gate_report"]
                .get("0", {})
                .get("waiting_for_drift")
            ),
            what="the wave to wait for a drift judgement",
        )
        doc = cp.admin.get(f"/api/v1/rollouts/{waiting}").json()
        assert doc["state"] == "running", doc
        assert doc["gate_report"]["0"]["drift"]["devices_judged"] == 0
        assert cp.admin.post(f"/api/v1/rollouts/{waiting}/cancel").status_code == 200
        wait_rollout(cp, waiting, "cancelled")
        allowed = rollout(cp, 3, waves=["100%"], gates={**gates, "allow_unjudged": True})
        done = wait_rollout(cp, allowed, "succeeded")
        assert "waiting_for_drift" not in done["gate_report"]["0"]
