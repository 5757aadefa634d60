"""Drift state that outlives a control plane and spans replicas (issue 47, item 6): a device's
windows ingested by one control plane and then by the one started after it on the same database
(SQLite and PostgreSQL), or split between two replicas (PostgreSQL), are judged as one device's
windows. Real broker, real control planes, the agent's own
sketching (``InputSketchBook``) for what a device sends."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import create_engine, select

from agent.inference.sketches import InputSketchBook, InputSketchSettings
from common.protocol.messages import ModelTelemetry, Telemetry
from control_plane.db.models import DriftSketch
from control_plane.db.session import sync_url
from control_plane.settings.drift import DriftSettings
from runtimes.examples.variants import mlp_version
from tests.access.mqtt_client import ProbeClient
from tests.agent.server import wait_until
from tests.control_plane.conftest import ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.control_plane.test_rollouts import push
from tests.mqtt_broker import Mosquitto, free_port

ROWS = 200
"""Sampled rows of a window."""
DECAY = 0.5
# Three windows hold 200 * (1 + 1/2 + 1/4) = 350 rows, six 393.75: only the six of both
# control planes together reach min_rows.
MIN_ROWS = 390.0
DRIFT = DriftSettings(psi_threshold=0.2, decay=DECAY, min_rows=MIN_ROWS, fleet_interval_s=0)
RNG = np.random.default_rng(7)


def reference_npz() -> bytes:
    buf = io.BytesIO()
    x = RNG.normal(0, 1, (400, 4)).astype(np.float32)
    np.savez(buf, **{"input:x": x, "labels": np.zeros(400, dtype=np.int64)})
    return buf.getvalue()


def window(seq: int) -> bytes:
    """A telemetry window of ``dev-1`` serving mlp v2, its inputs shifted by 3."""
    book = InputSketchBook(InputSketchSettings(sample_rows_per_window=ROWS))
    book.observe("mlp", 2, {"x": (RNG.normal(0, 1, (ROWS, 4)) + 3).astype(np.float32)})
    sketches = book.take_all()[("mlp", 2)].inputs
    model = ModelTelemetry(
        model="mlp", version=2, requests=1, errors=0, rows=ROWS, batches=1, inputs=sketches
    )
    message = Telemetry(
        device_id="dev-1", seq=seq, time=datetime.now(UTC), window_s=1.0, models=[model]
    )
    return message.model_dump_json().encode()


def drift(cp: RunningControlPlane) -> dict[str, Any]:
    answer = cp.admin.get("/api/v1/models/mlp/versions/2/drift")
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def test_a_restarted_control_plane_judges_the_windows_merged_before(
    start_control_plane: ControlPlaneFactory, broker: Mosquitto, db_url: str, tmp_path: Path
) -> None:
    device = ProbeClient(broker.port)
    assert device.connect() == 0
    windows = [window(seq) for seq in range(1, 7)]

    def send(seqs: range) -> None:
        for seq in seqs:
            device.client.publish("edgefleet/devices/dev-1/telemetry", windows[seq - 1], qos=1)

    try:
        with start_control_plane(drift=DRIFT) as first:
            push(first.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
            put = first.admin.put(
                "/api/v1/models/mlp/versions/2/reference", content=reference_npz()
            )
            assert put.status_code == 200, put.text
            send(range(1, 4))
            send(range(2, 3))  # one sent again: merged once
            wait_until(lambda: merged_windows(db_url) == 3, what="the first three windows merged")
            assert drift(first)["devices"] == []  # 350 rows: under min_rows, nothing judged
        with start_control_plane(drift=DRIFT) as second:
            send(range(4, 7))
            wait_until(lambda: drift(second)["devices"], what="dev-1 judged")
            doc = drift(second)
    finally:
        device.close()
    (judged,) = doc["devices"]
    # the six windows, decayed as one device's: 200 * (1 - 1/2**6) / (1 - 1/2)
    assert (judged["windows"], judged["rows"]) == (6, 393.8)
    assert judged["over_threshold"] and judged["psi"] > 1.0
    assert doc["fleet"] is not None and doc["fleet"]["windows"] == 6
    assert doc["fleet"]["psi"] == pytest.approx(judged["psi"])


def merged_windows(db_url: str) -> int:
    """The windows the control planes merged of dev-1's mlp v2, as stored."""
    engine = create_engine(sync_url(db_url))
    try:
        with engine.connect() as conn:
            windows = conn.execute(
                select(DriftSketch.windows).where(DriftSketch.device_id == "dev-1")
            ).scalar_one_or_none()
    finally:
        engine.dispose()
    return windows or 0


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_two_replicas_sharing_the_ingest_judge_every_window_alike(
    broker: Mosquitto, db_url: str, tmp_path: Path
) -> None:
    """Replicas in one shared subscription group each receive about half of a device's
    windows (Mosquitto deals them round robin): both judge the device from all of them."""
    device = ProbeClient(broker.port)
    assert device.connect() == 0
    shared = {"drift": DRIFT, "mqtt_shared_group": "cp"}  # and one state directory: its keys
    try:
        with (
            control_plane(
                tmp_path / "state", db_url, broker.url, free_port(), mqtt_client_id="cp-a", **shared
            ) as a,
            control_plane(
                tmp_path / "state", db_url, broker.url, free_port(), mqtt_client_id="cp-b", **shared
            ) as b,
        ):
            push(a.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
            put = a.admin.put("/api/v1/models/mlp/versions/2/reference", content=reference_npz())
            assert put.status_code == 200, put.text
            for seq in range(1, 9):
                device.client.publish("edgefleet/devices/dev-1/telemetry", window(seq), qos=1)
            wait_until(lambda: merged_windows(db_url) == 8, what="the eight windows merged")
            # a replica counts its batch after the commit that the line above reads
            wait_until(
                lambda: a.services.ingestor.stored + b.services.ingestor.stored == 8,
                what="both replicas counting what they stored",
            )
            # each replica stored about half of them: both took part
            assert 0 < a.services.ingestor.stored < 8 and 0 < b.services.ingestor.stored < 8
            doc = drift(b)
    finally:
        device.close()
    (judged,) = doc["devices"]
    # 200 * (1 - 1/2**8) / (1 - 1/2): every window once
    assert (judged["windows"], judged["rows"]) == (8, 398.4)
    assert judged["over_threshold"]
