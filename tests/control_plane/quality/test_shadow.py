"""On-device shadow before the switch, with a real control plane, broker and agent: a candidate
that disagrees with the serving version on about 30 % of live requests is never switched to
(the serving version stays, the candidate is unloaded), one that agrees is switched to; and
the rows per second the agent's batch tuning measured for what it serves reach `models list`."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from agent.fleet.settings import FleetSettings
from runtimes.golden import GOLDEN_FILE, GoldenSample
from tests.agent.server import RunningAgent, copy_models, serve, wait_until
from tests.control_plane.quality.conftest import edgefleet
from tests.control_plane.server import RunningControlPlane
from tests.mqtt_broker import Mosquitto

CYCLE = (0, 1, 2)
"""Output classes the disagreeing candidate rotates: every digit the serving model calls 0, 1
or 2 (about 30 % of the held-out set) the candidate calls something else."""
SERVING = """
[batching]
tune = true
max_batch_size = 16
[health]
window_s = 0.2
min_requests = 100000
self_test = true
"""


def rotated_digits(source: Path, target: Path) -> None:
    """The digits model with the rows of its last layer for CYCLE rotated (logit ``c`` of the
    candidate is the serving model's logit of the next class in the cycle), and a golden sample
    of its own answers: it loads and passes its self-test, and disagrees on ~30 % of inputs."""
    target.mkdir(parents=True)
    model = onnx.load(source / "model.onnx")
    order = list(range(10))
    for i, c in enumerate(CYCLE):
        order[c] = CYCLE[(i + 1) % len(CYCLE)]
    for init in model.graph.initializer:
        if init.name in ("fc1.weight", "fc1.bias"):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init)[order], init.name))
    onnx.save(model, target / "model.onnx")
    golden = GoldenSample.load(source / GOLDEN_FILE)
    rotated = {k: v[:, order] for k, v in golden.outputs.items()}
    GoldenSample(golden.inputs, rotated, golden.rtol, golden.atol).save(target / GOLDEN_FILE)


@contextmanager
def traffic(agent: RunningAgent, rows: np.ndarray) -> Iterator[list[str]]:
    """Live requests of 4 digits each, in a loop, until the block ends; the versions that
    answered, in order."""
    answered: list[str] = []
    stop = threading.Event()

    def run() -> None:
        with httpx.Client(base_url=agent.url, timeout=30) as client:
            i = 0
            while not stop.is_set():
                batch = rows[i % (len(rows) - 4) :][:4]
                i += 4
                body = {
                    "inputs": [
                        {
                            "name": "input",
                            "shape": list(batch.shape),
                            "datatype": "FP32",
                            "data": batch.ravel().tolist(),
                        }
                    ]
                }
                answer = client.post("/v2/models/digits/infer", json=body)
                if answer.status_code == 200:
                    answered.append(answer.json()["model_version"])

    thread = threading.Thread(target=run, name="traffic", daemon=True)
    thread.start()
    try:
        yield answered
    finally:
        stop.set()
        thread.join(timeout=30)


def _rollout(cp: RunningControlPlane, version: int, min_agreement: float) -> dict[str, Any]:
    spec = {
        "model": "digits",
        "version": version,
        "selector": {"site": "shadow-lab"},
        "waves": ["100%"],
        "bake_time_s": 0.2,
        "device_timeout_s": 60,
        "gates": {"allow_unjudged": True},
        "shadow": {
            "sample_share": 1.0,
            "min_agreement": min_agreement,
            "min_requests": 40,
            "timeout_s": 90,
        },
    }
    created = cp.admin.post("/api/v1/rollouts", json=spec)
    assert created.status_code == 201, created.text
    rollout_id = created.json()["id"]

    def finished() -> bool:
        doc = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
        return doc["state"] in ("succeeded", "rolled_back", "cancelled")

    wait_until(finished, timeout_s=120, what=f"the rollout of v{version} to finish")
    doc: dict[str, Any] = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
    return doc


def _state(cp: RunningControlPlane, rollout_id: int) -> str:
    state: str = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()["state"]
    return state


@pytest.mark.slow
def test_a_disagreeing_candidate_is_not_switched_and_an_agreeing_one_is(
    cp: RunningControlPlane, broker: Mosquitto, examples: Path, tmp_path: Path
) -> None:
    serving = examples / "digits/1"
    rotated_digits(serving, tmp_path / "rotated")
    same = tmp_path / "same"
    same.mkdir()
    for name in ("model.onnx", GOLDEN_FILE):
        shutil.copy(serving / name, same / name)
    config = tmp_path / "serving.toml"
    config.write_text(SERVING)
    for version, source in ((2, tmp_path / "rotated"), (3, same)):
        pushed = edgefleet(
            cp, "models", "push", "digits", str(version), str(source), "--config", str(config)
        )
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        checked = edgefleet(cp, "models", "validate", "digits", str(version))
        assert checked.returncode == 0, checked.stdout

    fleet = FleetSettings(
        mqtt_url=broker.url,
        device_id="shadow-box",
        labels={"site": "shadow-lab"},
        state_dir=tmp_path / "state",
        trust_root_file=cp.trust_root_file,
        telemetry_interval_s=0.2,
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
    )
    repo = copy_models(examples, tmp_path / "repo", "digits")
    held_out = np.load(serving / "reference.npz")["input:input"].astype(np.float32)
    with serve(repo, profile="generic-x86_64", fleet=fleet) as agent:
        wait_until(
            lambda: any(d["id"] == "shadow-box" for d in cp.admin.get("/api/v1/devices").json()),
            timeout_s=60,
            what="the device in the inventory",
        )
        with traffic(agent, held_out) as answered:
            refused = _rollout(cp, 2, min_agreement=0.9)
            # the rotated candidate: judged on live requests, never served, unloaded
            assert refused["state"] == "rolled_back", refused
            assert "below min_agreement 90.0%" in refused["reason"], refused["reason"]
            wave = refused["shadow"]["waves"]["0"]
            assert wave["state"] == "failed" and wave["withdrawn"], wave
            assert wave["requests"] >= 40 and 0.55 <= wave["agreement"] <= 0.85, wave
            assert wave["max_abs_diff"] > 0 and wave["candidate_ms"] is not None
            assert refused["devices"][0]["state"] == "reverted", refused["devices"]
            assert "2" not in answered
            wait_until(
                lambda: not (repo / "digits/2").exists(),
                timeout_s=30,
                what="the candidate's files removed",
            )
            index = agent.client.post("/v2/repository/index", json={}).json()
            assert not [r for r in index if r.get("version") == "2" and r["state"] == "READY"]
            seen = len(answered)

            # the identical candidate, as an operator starts it: it agrees, the wave switches
            # the shadow gate is what is judged here: the p99 gate, against v1's latency before
            # the rollout, is noise on a host shared with another test worker
            options = {
                "--model": "digits",
                "--version": "3",
                "--selector": "site=shadow-lab",
                "--waves": "100%",
                "--bake-time": "0.2",
                "--max-p99-ratio": "1000",
                "--shadow": "1.0",
                "--min-agreement": "0.99",
                "--shadow-min-requests": "40",
                "--shadow-timeout": "90",
            }
            args = [word for pair in options.items() for word in pair]
            created = edgefleet(cp, "rollouts", "create", *args, "--allow-unjudged", "--json")
            assert created.returncode == 0, created.stdout + created.stderr
            rollout_id = json.loads(created.stdout)["id"]
            wait_until(
                lambda: _state(cp, rollout_id) in ("succeeded", "rolled_back"),
                timeout_s=120,
                what="the rollout of v3 to finish",
            )
            switched = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
            assert switched["state"] == "succeeded", (switched["reason"], switched["shadow"])
            status = edgefleet(cp, "rollouts", "status", str(rollout_id)).stdout
            assert "shadow passed: agreement 100.0% (min 99.0%)" in status, status
            wave = switched["shadow"]["waves"]["0"]
            assert wave["state"] == "passed" and wave["agreement"] == 1.0, wave
            wait_until(lambda: "3" in answered[seen:], timeout_s=30, what="v3 answering")
        assert set(answered[:seen]) == {"1"}

        # the switched-to version was tuned at load: its speed is in `models list`
        def listed() -> str | None:
            out = edgefleet(cp, "models", "list").stdout
            return out if "rows/s on generic-x86_64" in out else None

        wait_until(listed, timeout_s=30, what="a measured speed in models list")
        line = next(
            ln for ln in (listed() or "").splitlines() if ln.strip().startswith("v3 variant 0")
        )
        assert "fp32 for any profile: measured " in line and "(batch " in line, line


@pytest.mark.slow
def test_cancel_in_the_shadow_phase_unloads_the_candidate(
    cp: RunningControlPlane, broker: Mosquitto, examples: Path, tmp_path: Path
) -> None:
    """A cancelled rollout withdraws what its shadow phase staged, as a rollback does: the
    candidate never serves and does not stay loaded until the next desired state."""
    serving = examples / "digits/1"
    pushed = edgefleet(cp, "models", "push", "digits", "7", str(serving))
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert edgefleet(cp, "models", "validate", "digits", "7").returncode == 0
    fleet = FleetSettings(
        mqtt_url=broker.url,
        device_id="shadow-cancel",
        labels={"site": "shadow-cancel"},
        state_dir=tmp_path / "state",
        trust_root_file=cp.trust_root_file,
        telemetry_interval_s=0.2,
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
    )
    repo = copy_models(examples, tmp_path / "repo", "digits")
    with serve(repo, profile="generic-x86_64", fleet=fleet):
        wait_until(
            lambda: any(d["id"] == "shadow-cancel" for d in cp.admin.get("/api/v1/devices").json()),
            timeout_s=60,
            what="the device in the inventory",
        )
        spec = {
            "model": "digits",
            "version": 7,
            "selector": {"site": "shadow-cancel"},
            "waves": ["100%"],
            "gates": {"allow_unjudged": True},
            # no traffic: the phase would wait for these requests for ten minutes
            "shadow": {"min_requests": 100000, "timeout_s": 600},
        }
        created = cp.admin.post("/api/v1/rollouts", json=spec)
        assert created.status_code == 201, created.text
        rollout_id = created.json()["id"]
        wait_until(lambda: (repo / "digits/7").is_dir(), what="the candidate staged")
        cancelled = edgefleet(cp, "rollouts", "cancel", str(rollout_id))
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.strip().endswith("0 not reached, 1 shadow(s) unloaded")
        doc = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
        assert doc["shadow"]["waves"]["0"]["withdrawn"] is True
        (device,) = doc["devices"]
        assert (device["state"], device["reason"]) == (
            "reverted",
            "shadow withdrawn: the candidate is unloaded, never switched to",
        )
        wait_until(lambda: not (repo / "digits/7").exists(), what="the candidate unloaded")


@pytest.mark.parametrize(
    ("shadow", "field"),
    [
        ({"sample_share": 0}, "shadow.sample_share"),
        ({"sample_share": 1.5}, "shadow.sample_share"),
        ({"min_agreement": 1.01}, "shadow.min_agreement"),
        ({"min_requests": 0}, "shadow.min_requests"),
        ({"timeout_s": -1}, "shadow.timeout_s"),
        ({"window": 3}, "shadow.window"),
    ],
)
def test_bad_shadow_settings_are_refused_naming_the_field(
    cp: RunningControlPlane, shadow: dict[str, Any], field: str
) -> None:
    spec = {"model": "digits", "version": 1, "shadow": shadow}
    answer = cp.admin.post("/api/v1/rollouts", json=spec)
    assert answer.status_code == 400, answer.text
    assert field in answer.text, answer.text
