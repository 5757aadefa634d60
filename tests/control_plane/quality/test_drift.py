"""Input drift with a real agent, broker and control plane: the agent sketches the digits it
serves, the control plane compares them with the version's reference set, and a rollout with
``max_drift`` pauses when the local traffic shifts, and goes through when it does not."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from agent.fleet.settings import FleetSettings
from control_plane.settings.drift import DriftSettings
from tests.agent.server import RunningAgent, copy_models, serve, wait_until
from tests.control_plane.quality.conftest import edgefleet
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.mqtt_broker import Mosquitto, free_port

THRESHOLD = 0.2
OFFSET = 3.0
"""Added to every pixel (0..16) once the traffic shifts."""


@pytest.fixture(scope="module")
def cp(
    tmp_path_factory: pytest.TempPathFactory, broker: Mosquitto
) -> Iterator[RunningControlPlane]:
    """Judged from 300 sampled rows, the fleet at every batch (defaults: 500, every 10 s)."""
    root = tmp_path_factory.mktemp("drift-cp")
    drift = DriftSettings(psi_threshold=THRESHOLD, min_rows=300, fleet_interval_s=0)
    db = f"sqlite+aiosqlite:///{root}/cp.db"
    with control_plane(root / "cp", db, broker.url, free_port(), drift=drift) as running:
        yield running


class Traffic:
    """Local clients sending batches of the reference digits, shifted by ``offset``."""

    def __init__(self, agent: RunningAgent, inputs: np.ndarray) -> None:
        self.agent, self.inputs = agent, inputs
        self.offset = 0.0
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = np.random.default_rng(1)
        while not self._stop.wait(0.02):  # paced, about 1,000 rows a second
            rows = self.inputs[rng.integers(0, len(self.inputs), 32)] + self.offset
            if self.agent.infer_json("digits", rows).status_code == 200:
                self.answered += 1

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def drift_of(cp: RunningControlPlane, version: int) -> dict[str, Any]:
    answer = cp.admin.get(f"/api/v1/models/digits/versions/{version}/drift")
    assert answer.status_code == 200, answer.text
    doc: dict[str, Any] = answer.json()
    return doc


def roll_out(cp: RunningControlPlane, version: int, bake_time_s: float) -> int:
    spec = {
        "model": "digits",
        "version": version,
        "selector": {"site": "drift-lab"},
        "waves": ["100%"],
        "bake_time_s": bake_time_s,
        "device_timeout_s": 60,
        # latency is not what is tested: traffic and two control loops share two CPUs
        "gates": {"max_drift": THRESHOLD, "min_requests": 20, "max_p99_ratio": 1000},
    }
    created = cp.admin.post("/api/v1/rollouts", json=spec)
    assert created.status_code == 201, created.text
    rollout_id: int = created.json()["id"]
    return rollout_id


def rollout(cp: RunningControlPlane, rollout_id: int) -> dict[str, Any]:
    doc: dict[str, Any] = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
    return doc


@pytest.mark.slow
def test_shifted_traffic_pauses_the_rollout_and_unshifted_does_not(
    cp: RunningControlPlane,
    broker: Mosquitto,
    examples: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="edgefleet.control_plane.drift")
    version_dir = examples / "digits/1"
    reference = version_dir / "reference.npz"
    health = tmp_path / "serving.toml"
    health.write_text("[health]\nwindow_s = 0.2\nmin_requests = 100000\nself_test = true\n")
    for version in ("2", "3"):
        pushed = edgefleet(
            cp,
            "models",
            "push",
            "digits",
            version,
            str(version_dir),
            "--config",
            str(health),
            "--reference",
            str(reference),
            "--no-optimise",
        )
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        assert edgefleet(cp, "models", "validate", "digits", version).returncode == 0
    with np.load(reference) as data:
        inputs = data["input:input"].astype(np.float32)

    fleet = FleetSettings(
        mqtt_url=broker.url,
        device_id="drift-box",
        labels={"site": "drift-lab"},
        state_dir=tmp_path / "state",
        trust_root_file=cp.trust_root_file,
        telemetry_interval_s=0.5,
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
    )
    repo = copy_models(examples, tmp_path / "repo", "digits")
    with serve(repo, fleet=fleet) as agent, Traffic(agent, inputs) as traffic:
        wait_until(
            lambda: any(d["id"] == "drift-box" for d in cp.admin.get("/api/v1/devices").json()),
            timeout_s=60,
            what="the device in the inventory",
        )
        # 1. traffic like the reference set: the drift gate judges it and lets the wave pass
        first = roll_out(cp, 2, bake_time_s=4)
        wait_until(
            lambda: rollout(cp, first)["state"] not in ("running",),
            timeout_s=120,
            what="the unshifted rollout to finish",
        )
        doc = rollout(cp, first)
        assert doc["state"] == "succeeded", doc["reason"]
        gate = doc["gate_report"]["0"]["drift"]
        assert gate["devices_judged"] == 1 and gate["psi"] < THRESHOLD, gate
        unshifted = drift_of(cp, 2)
        (device,) = unshifted["devices"]
        assert device["device_id"] == "drift-box" and not device["over_threshold"], device
        assert unshifted["fleet"]["psi"] < THRESHOLD
        assert {f["feature"] for f in device["features"]} == {-1, *range(8)}
        # the agent sketches the outputs and their top-1 classes too (output drift)
        judged = {f["input"] for f in device["features"]}
        assert judged == {"input", "output:logits", "top1:logits"}, judged
        assert not [r for r in caplog.records if r.getMessage() == "input drift over threshold"]

        # 2. the same traffic, then shifted while the next version bakes
        second = roll_out(cp, 3, bake_time_s=600)

        def judged_unshifted() -> bool:
            devices = drift_of(cp, 3)["devices"]
            return bool(devices) and devices[0]["windows"] >= 2

        wait_until(judged_unshifted, timeout_s=60, what="v3's drift judged on unshifted traffic")
        (device,) = drift_of(cp, 3)["devices"]
        assert device["psi"] < THRESHOLD, device
        windows_before = device["windows"]
        assert rollout(cp, second)["state"] == "running"
        traffic.offset = OFFSET
        wait_until(
            lambda: rollout(cp, second)["state"] != "running",
            timeout_s=60,
            what="the drift gate to stop the rollout",
        )
        doc = rollout(cp, second)
        assert doc["state"] == "paused", doc["reason"]  # paused, not rolled back
        # the shift moves the predicted class mix as well: whichever is worse is named
        assert re.match(r"(input|output) drift: PSI ", doc["reason"]), doc["reason"]
        gate = doc["gate_report"]["0"]["drift"]
        assert gate["paused"] and gate["psi"] > THRESHOLD and gate["device_id"] == "drift-box"
        # the alert: once, for this device, within 3 windows of the one the shift began in
        alerts = [
            r
            for r in caplog.records
            if r.getMessage() == "input drift over threshold"
            and (r.__dict__["version"], r.__dict__["device_id"]) == (3, "drift-box")
        ]
        assert len(alerts) == 1
        assert alerts[0].__dict__["windows"] - windows_before <= 1 + 3, alerts[0].__dict__
        metrics = cp.admin.get("/metrics").text
        line = 'edgefleet_input_drift_psi{device="max",model="digits",version="3"}'
        (value,) = [float(x.split()[-1]) for x in metrics.splitlines() if x.startswith(line)]
        assert value > THRESHOLD
        # what the operator sees
        shown = edgefleet(cp, "models", "drift", "digits", "3")
        assert shown.returncode == 0 and f"drift-box: OVER {THRESHOLD:g}  PSI " in shown.stdout
        status = edgefleet(cp, "rollouts", "status", str(second))
        assert "paused (input drift: PSI" in status.stdout, status.stdout
        # a viewer reads it, in the API and on the console's model page
        token = cp.token("viewer")
        with cp.client(token) as viewer:
            assert viewer.get("/api/v1/models/digits/versions/3/drift").status_code == 200
        with httpx.Client(base_url=cp.url, timeout=60) as browser:
            assert browser.post("/ui/login", data={"token": token}).status_code == 303
            page = browser.get("/ui/models/digits/versions/3").text
        assert "Input drift" in page and f"over {THRESHOLD}" in page and "drift-box" in page
        # the device still serves the version: nothing rolled back
        assert agent.infer_json("digits", inputs[:1]).json()["model_version"] == "3"
        assert traffic.answered > 0
        assert cp.admin.post(f"/api/v1/rollouts/{second}/cancel").status_code in (200, 202)
