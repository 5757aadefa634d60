"""Corrupt model files on disk at start-up, on a real agent process with its fleet client on:
a torn write (a TFLite file cut in half) and bit rot (a block of an ONNX model's weights
overwritten, so it still parses). Each of those models is reported failed, with the reason, in
its readiness, the repository index, the logs and the device's status topic; the healthy model
serves. A fleet-installed version that rotted is downloaded again when rolled out again.
(A file of garbage bytes on the in-thread agent: tests/agent/inference/test_lifecycle.py.)"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import httpx
import pytest

from agent.fleet.settings import FleetSettings
from runtimes.examples.variants import mlp_version
from tests.agent.fleet.publisher import Fleet
from tests.agent.fleet.test_faults import _process_config
from tests.agent.fleet.test_updates import served
from tests.agent.process import agent_process
from tests.agent.server import copy_models, serve, wait_until
from tests.faults.burst import BODY
from tests.mqtt_broker import Mosquitto

pytestmark = pytest.mark.slow


def test_corrupt_models_at_start_up_are_reported_failed_and_the_healthy_one_serves(
    fleet: Fleet, broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp", "mlp_tflite")
    torn = repo / "mlp_tflite/1/model.tflite"
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])
    shutil.copytree(repo / "mlp", repo / "mlp_rot")
    rotten = repo / "mlp_rot/1/model.onnx"
    data = bytearray(rotten.read_bytes())
    middle = len(data) // 2  # inside the weights: the file still parses
    data[middle : middle + 65536] = b"\x41" * 65536
    rotten.write_bytes(bytes(data))
    config = _process_config(tmp_path, fleet, broker, repo)
    with (
        agent_process("--config", str(config)) as agent,
        httpx.Client(base_url=agent.address, timeout=60) as client,
    ):
        wait_until(
            lambda: "start-up load finished" in agent.log_messages(), what="the start-up load"
        )
        assert client.post("/v2/models/mlp/infer", json=BODY).status_code == 200
        assert client.get("/v2/models/mlp/ready").status_code == 200
        index = {r["name"]: r for r in client.get("/v2/repository/index").json()}
        assert index["mlp"]["state"] == "READY"
        for name in ("mlp_tflite", "mlp_rot"):
            assert client.get(f"/v2/models/{name}/ready").status_code == 503
            assert index[name]["state"] == "UNAVAILABLE" and index[name]["reason"], index[name]
        assert "self-test failed" in index["mlp_rot"]["reason"]
        resp = client.post("/v2/models/mlp_rot/infer", json=BODY)
        assert resp.status_code == 503 and "self-test failed" in resp.text
        # strict readiness (the default): the device is not ready while a model is failed
        assert client.get("/v2/health/ready").status_code == 503
        failed = {
            r.get("model"): r.get("reason")
            for r in agent.logs
            if r.get("message") == "version failed to load"
        }
        assert set(failed) == {"mlp_tflite", "mlp_rot"}, failed
        # the fleet sees what the device serves: only the healthy model
        status = fleet.wait(
            lambda: [s for s in fleet.statuses("dev-k") if s.online and s.models],
            what="the device's status",
        )[-1]
        assert [(m.model, m.version) for m in status.models] == [("mlp", 1)]


def test_a_rotten_fleet_installed_version_is_downloaded_again_when_rolled_out_again(
    fleet: Fleet, broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    settings = FleetSettings(
        mqtt_url=broker.url,
        device_id="dev-c",
        state_dir=tmp_path / "state",
        trust_root_file=fleet.write_trust_root(tmp_path / "trust.json"),
        telemetry_interval_s=0.5,
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
    )
    v2 = mlp_version(tmp_path / "v2", seed=2)
    fleet.publish_desired("dev-c", fleet.sign(fleet.manifest("mlp", 2, 1, v2)))
    with serve(repo, fleet=settings) as agent:
        fleet.wait_event("dev-c", "committed", sequence=1)
        assert served(agent)[0] == "2"
    model_file = repo / "mlp/2/model.onnx"
    data = bytearray(model_file.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 65536] = b"\x41" * 65536  # rot, still parses
    model_file.write_bytes(bytes(data))
    with serve(repo, fleet=settings) as agent:
        index = {
            (r["name"], r["version"]): r for r in agent.client.get("/v2/repository/index").json()
        }
        assert "self-test failed" in index[("mlp", "2")]["reason"]
        assert agent.client.get("/v2/models/mlp/ready").status_code == 503
        # the operator rolls the same version out again: a new sequence, the same files
        fleet.publish_desired("dev-c", fleet.sign(fleet.manifest("mlp", 2, 2, v2)))
        fleet.wait_event("dev-c", "committed", sequence=2)
        assert served(agent)[0] == "2"
    digest = hashlib.sha256((v2 / "model.onnx").read_bytes()).hexdigest()
    fetched = [rng for d, rng in fleet.artifacts.requests if d == digest]
    assert len(fetched) == 2 and fetched[1] is None, fetched  # downloaded again, in full
