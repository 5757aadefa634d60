"""An INT8 variant rolled out to a real agent of a CPU profile: it downloads that variant, not
the FP32 one, and passes its self-test with the golden sample made for it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from agent.fleet.settings import FleetSettings
from tests.agent.server import copy_models, serve, wait_until
from tests.control_plane.quality.conftest import edgefleet
from tests.control_plane.server import RunningControlPlane
from tests.mqtt_broker import Mosquitto


@pytest.mark.slow
def test_a_cpu_device_serves_the_int8_variant_after_its_self_test(
    cp: RunningControlPlane, broker: Mosquitto, examples: Path, tmp_path: Path
) -> None:
    version_dir = examples / "digits/1"
    health = tmp_path / "serving.toml"
    health.write_text("[health]\nwindow_s = 0.2\nmin_requests = 100000\nself_test = true\n")
    pushed = edgefleet(
        cp,
        "models",
        "push",
        "digits",
        "2",
        str(version_dir),
        "--config",
        str(health),
        "--reference",
        str(version_dir / "reference.npz"),
    )
    assert pushed.returncode == 0 and "int8: built" in pushed.stdout, pushed.stdout
    assert edgefleet(cp, "models", "validate", "digits", "2").returncode == 0
    int8 = cp.admin.get("/api/v1/models/digits/versions/2").json()["variants"][1]
    assert int8["optimisation"]["kind"] == "int8"

    fleet = FleetSettings(
        mqtt_url=broker.url,
        device_id="cpu-box",
        labels={"site": "lab"},
        state_dir=tmp_path / "state",
        trust_root_file=cp.trust_root_file,
        telemetry_interval_s=0.2,
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
    )
    repo = copy_models(examples, tmp_path / "repo", "digits")
    with serve(repo, profile="generic-x86_64", fleet=fleet) as agent:
        wait_until(
            lambda: any(d["id"] == "cpu-box" for d in cp.admin.get("/api/v1/devices").json()),
            timeout_s=60,
            what="the device in the inventory",
        )
        spec = {
            "model": "digits",
            "version": 2,
            "selector": {"site": "lab"},
            "waves": ["100%"],
            "bake_time_s": 0.2,
            "device_timeout_s": 60,
            "gates": {"allow_unjudged": True},
        }
        created = cp.admin.post("/api/v1/rollouts", json=spec)
        assert created.status_code == 201, created.text
        rollout_id = created.json()["id"]

        def finished() -> dict[str, object] | None:
            doc = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
            return doc if doc["state"] in ("succeeded", "failed", "rolled_back") else None

        wait_until(finished, timeout_s=90, what="the rollout to finish")
        doc = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
        assert doc["state"] == "succeeded", doc
        answer = agent.infer_json("digits", [[0.0] * 64])
        assert answer.status_code == 200 and answer.json()["model_version"] == "2", answer.text
        model_sha = next(f["sha256"] for f in int8["files"] if f["name"] == "model.onnx")
        installed = repo / "digits/2"
        assert hashlib.sha256((installed / "model.onnx").read_bytes()).hexdigest() == model_sha
        # its own golden (the FP32 one expects answers within 1e-4, which INT8 does not give)
        golden_sha = next(f["sha256"] for f in int8["files"] if f["name"] == "golden.npz")
        assert hashlib.sha256((installed / "golden.npz").read_bytes()).hexdigest() == golden_sha
