"""Input drift of a pipeline with a real agent, broker and control plane: the ``classifier``
example (JPEG bytes -> decode, resize, normalise -> CNN -> top-5) is sketched at its model
step, the control plane runs the version's reference JPEGs through the same steps at
validation, and a rollout with ``max_drift`` goes through on like traffic and pauses when
the images brighten."""

from __future__ import annotations

import base64
import io
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from agent.fleet.settings import FleetSettings
from control_plane.settings.drift import DriftSettings
from runtimes.examples.classifier import write_classifier
from tests.agent.server import RunningAgent, serve, wait_until
from tests.control_plane.quality.conftest import edgefleet
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.mqtt_broker import Mosquitto, free_port

THRESHOLD = 0.2
SIZE = 32
"""The images' and the model's input size: the resize step keeps them as they are."""
BRIGHTER = 70
"""Added to every pixel (clipped at 255) once the traffic shifts."""
ROWS, SEED = 400, 3
"""The reference set's images."""


@pytest.fixture(scope="module")
def cp(
    tmp_path_factory: pytest.TempPathFactory, broker: Mosquitto
) -> Iterator[RunningControlPlane]:
    """Judged from 300 sampled rows, the fleet at every batch (defaults: 500, every 10 s)."""
    root = tmp_path_factory.mktemp("pipeline-drift-cp")
    drift = DriftSettings(psi_threshold=THRESHOLD, min_rows=300, fleet_interval_s=0)
    db = f"sqlite+aiosqlite:///{root}/cp.db"
    with control_plane(root / "cp", db, broker.url, free_port(), drift=drift) as running:
        yield running


def jpegs(count: int, seed: int, brighter: int = 0) -> list[bytes]:
    """Noisy mid-grey images, encoded as a camera would send them."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        pixels = rng.integers(60, 190, (SIZE, SIZE, 3)) + brighter
        buffer = io.BytesIO()
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB").save(buffer, "JPEG")
        out.append(buffer.getvalue())
    return out


class Traffic:
    """Local clients sending batches of images over TF Serving's REST API, brighter by
    ``brighter`` once set."""

    def __init__(self, agent: RunningAgent) -> None:
        self.agent = agent
        # the reference set's images, as test_drift sends the reference digits
        self.images = {0: jpegs(ROWS, SEED), BRIGHTER: jpegs(ROWS, SEED, brighter=BRIGHTER)}
        self.brighter = 0
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = np.random.default_rng(1)
        while not self._stop.wait(0.02):
            pool = self.images[self.brighter]
            batch = [pool[i] for i in rng.integers(0, len(pool), 16)]
            body = {"instances": [{"b64": base64.b64encode(b).decode()} for b in batch]}
            if self.agent.client.post("/v1/models/classifier:predict", json=body).is_success:
                self.answered += 1

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def roll_out(cp: RunningControlPlane, version: int, bake_time_s: float) -> int:
    spec = {
        "model": "classifier",
        "version": version,
        "selector": {"site": "pipeline-drift-lab"},
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


def drift_of(cp: RunningControlPlane, version: int) -> dict[str, Any]:
    answer = cp.admin.get(f"/api/v1/models/classifier/versions/{version}/drift")
    assert answer.status_code == 200, answer.text
    doc: dict[str, Any] = answer.json()
    return doc


@pytest.mark.slow
def test_a_pipeline_is_judged_at_its_model_and_shifted_images_pause_it(
    cp: RunningControlPlane, broker: Mosquitto, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    version_dir = repo / "classifier" / "1"
    version_dir.mkdir(parents=True)
    write_classifier(version_dir, image_size=SIZE)
    reference = tmp_path / "reference.npz"
    images = jpegs(ROWS, SEED)
    np.savez(
        reference,
        **{"input:image": np.array(images, dtype=bytes), "labels": np.zeros(ROWS, np.int64)},
    )
    health = tmp_path / "serving.toml"
    health.write_text("[health]\nwindow_s = 0.2\nmin_requests = 100000\nself_test = true\n")
    for version in ("2", "3"):
        pushed = edgefleet(
            cp,
            "models",
            "push",
            "classifier",
            version,
            str(version_dir),
            "--config",
            str(health),
            "--reference",
            str(reference),
            "--no-optimise",
        )
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        validated = edgefleet(cp, "models", "validate", "classifier", version)
        assert validated.returncode == 0, validated.stdout + validated.stderr
    doc = cp.admin.get("/api/v1/models/classifier/versions/2").json()
    assert doc["validation"]["model_reference"]["name"] == "model_reference.npz", doc

    fleet = FleetSettings(
        mqtt_url=broker.url,
        device_id="pipeline-box",
        labels={"site": "pipeline-drift-lab"},
        state_dir=tmp_path / "state",
        trust_root_file=cp.trust_root_file,
        telemetry_interval_s=0.5,
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
    )
    with serve(repo, fleet=fleet) as agent, Traffic(agent) as traffic:
        wait_until(
            lambda: any(d["id"] == "pipeline-box" for d in cp.admin.get("/api/v1/devices").json()),
            timeout_s=60,
            what="the device in the inventory",
        )
        # 1. images like the reference set's: judged at the model step, the wave passes
        first = roll_out(cp, 2, bake_time_s=4)
        wait_until(
            lambda: rollout(cp, first)["state"] != "running",
            timeout_s=120,
            what="the unshifted rollout to finish",
        )
        doc = rollout(cp, first)
        assert doc["state"] == "succeeded", doc["reason"]
        gate = doc["gate_report"]["0"]["drift"]
        assert gate["devices_judged"] == 1 and gate["psi"] < THRESHOLD, gate
        (device,) = drift_of(cp, 2)["devices"]
        assert device["device_id"] == "pipeline-box" and not device["over_threshold"], device
        # the model's tensors, not the JPEG bytes the app sent
        judged = {f["input"] for f in device["features"]}
        assert judged == {"input", "output:logits", "top1:logits"}, judged

        # 2. the same images, then brighter ones while the next version bakes
        second = roll_out(cp, 3, bake_time_s=600)

        def judged_unshifted() -> bool:
            devices = drift_of(cp, 3)["devices"]
            return bool(devices) and devices[0]["windows"] >= 2

        wait_until(judged_unshifted, timeout_s=60, what="v3's drift judged on like images")
        (device,) = drift_of(cp, 3)["devices"]
        assert device["psi"] < THRESHOLD, device
        assert rollout(cp, second)["state"] == "running"
        traffic.brighter = BRIGHTER
        wait_until(
            lambda: rollout(cp, second)["state"] != "running",
            timeout_s=60,
            what="the drift gate to stop the rollout",
        )
        doc = rollout(cp, second)
        assert doc["state"] == "paused", doc["reason"]  # paused, not rolled back
        assert re.match(r"(input|output) drift: PSI ", doc["reason"]), doc["reason"]
        gate = doc["gate_report"]["0"]["drift"]
        assert gate["paused"] and gate["psi"] > THRESHOLD and gate["device_id"] == "pipeline-box"
        assert traffic.answered > 0
        assert cp.admin.post(f"/api/v1/rollouts/{second}/cancel").status_code in (200, 202)
