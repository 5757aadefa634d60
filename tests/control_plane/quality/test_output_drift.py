"""Output drift (issue 50, item 3): a version whose inputs look like its reference set's but
whose predicted class mix collapses onto one class is over the threshold on its outputs' top-1
classes, and not on its inputs. Real broker and control plane; what the device sends is the
agent's own sketching (``InputSketchBook``) of inputs and outputs."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.inference.sketches import InputSketchBook, InputSketchSettings
from common.protocol.messages import ModelTelemetry, Telemetry
from control_plane.settings.drift import DriftSettings
from runtimes.examples.variants import mlp_version
from tests.access.mqtt_client import ProbeClient
from tests.agent.server import wait_until
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.control_plane.test_rollouts import push
from tests.mqtt_broker import Mosquitto, free_port

ROWS = 200
THRESHOLD = 0.2
DRIFT = DriftSettings(psi_threshold=THRESHOLD, decay=0.5, min_rows=150, fleet_interval_s=0)
CLASSES = 10


def logits(rng: np.random.Generator, rows: int, collapsed: bool) -> np.ndarray:
    """Scores of ``rows`` rows, each class as likely to score highest; ``collapsed``: class 3
    scores highest on every row (the same spread of values otherwise)."""
    scores = rng.normal(0, 1, (rows, CLASSES)).astype(np.float32)
    if collapsed:
        top = scores.argmax(axis=1)
        scores[np.arange(rows), [3] * rows], scores[np.arange(rows), top] = (
            scores[np.arange(rows), top],
            scores[np.arange(rows), [3] * rows],
        )
    return scores


def reference_npz() -> bytes:
    rng = np.random.default_rng(1)
    buf = io.BytesIO()
    x = rng.normal(0, 1, (600, 256)).astype(np.float32)
    np.savez(buf, **{"input:input": x, "output:logits": logits(rng, 600, collapsed=False)})
    return buf.getvalue()


def window(seq: int, rng: np.random.Generator, collapsed: bool) -> bytes:
    book = InputSketchBook(InputSketchSettings(sample_rows_per_window=ROWS))
    x = rng.normal(0, 1, (ROWS, 256)).astype(np.float32)
    book.observe("mlp", 2, {"input": x}, {"logits": logits(rng, ROWS, collapsed)})
    sketches = book.take_all()[("mlp", 2)]
    model = ModelTelemetry(
        model="mlp",
        version=2,
        requests=1,
        errors=0,
        rows=ROWS,
        batches=1,
        inputs=sketches.inputs,
        outputs=sketches.outputs,
        top1=sketches.top1,
    )
    message = Telemetry(
        device_id="dev-out", seq=seq, time=datetime.now(UTC), window_s=1.0, models=[model]
    )
    return message.model_dump_json().encode()


@pytest.fixture()
def cp(tmp_path: Path, broker: Mosquitto) -> Iterator[RunningControlPlane]:
    db = f"sqlite+aiosqlite:///{tmp_path}/cp.db"
    with control_plane(tmp_path / "cp", db, broker.url, free_port(), drift=DRIFT) as running:
        yield running


def device_drift(cp: RunningControlPlane) -> dict[str, Any]:
    answer = cp.admin.get("/api/v1/models/mlp/versions/2/drift")
    assert answer.status_code == 200, answer.text
    devices = answer.json()["devices"]
    return devices[0] if devices else {}


def worst(device: dict[str, Any], prefix: str) -> float:
    psis = [f["psi"] for f in device["features"] if f["input"].startswith(prefix)]
    assert psis, device["features"]
    return max(psis)


def test_a_collapsed_class_mix_is_output_drift_and_not_input_drift(
    cp: RunningControlPlane, broker: Mosquitto, tmp_path: Path
) -> None:
    push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
    put = cp.admin.put("/api/v1/models/mlp/versions/2/reference", content=reference_npz())
    assert put.status_code == 200, put.text
    device = ProbeClient(broker.port)
    assert device.connect() == 0
    rng = np.random.default_rng(2)
    try:
        for seq in (1, 2):  # like the reference set
            device.client.publish(
                "edgefleet/devices/dev-out/telemetry", window(seq, rng, False), qos=1
            )
        wait_until(lambda: device_drift(cp).get("windows") == 2, what="two windows judged")
        calm = device_drift(cp)
        for seq in (3, 4, 5, 6):  # the same inputs, every row now predicted class 3
            device.client.publish(
                "edgefleet/devices/dev-out/telemetry", window(seq, rng, True), qos=1
            )
        wait_until(lambda: device_drift(cp).get("windows") == 6, what="six windows judged")
        shifted = device_drift(cp)
    finally:
        device.close()
    assert not calm["over_threshold"], calm
    assert worst(calm, "top1:logits") < THRESHOLD and worst(calm, "input") < THRESHOLD
    assert worst(calm, "output:logits") < THRESHOLD  # each class's scores alike throughout
    assert shifted["over_threshold"], shifted
    assert worst(shifted, "top1:logits") > 1.0, shifted["features"]
    assert worst(shifted, "input") < THRESHOLD, shifted["features"]
    assert shifted["psi"] == pytest.approx(worst(shifted, "top1:logits"))
