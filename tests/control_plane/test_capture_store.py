"""Captured samples into the control plane's store, on a real broker and control plane
(SQLite and PostgreSQL): an upload on a device's telemetry topic is stored once however often
it comes, each sample is acknowledged on the device's acks topic, and a sample whose archive
is not one is refused by name (and acknowledged, so the device stops sending it)."""

from __future__ import annotations

import base64
import io
import uuid
from datetime import UTC, datetime

import numpy as np

from common.protocol.capture import CapturedSample, CaptureTrigger, CaptureUpload, FleetAck
from tests.access.mqtt_client import ProbeClient
from tests.control_plane.conftest import ControlPlaneFactory
from tests.mqtt_broker import Mosquitto

TOPIC = "edgefleet/devices/store-box"


def archive(x: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **{"input:input": x, "output:logits": x * 2})
    return base64.b64encode(buffer.getvalue()).decode()


def sample(data_b64: str) -> CapturedSample:
    return CapturedSample(
        sample_id=uuid.uuid4().hex,
        model="digits",
        version=1,
        captured_at=datetime.now(UTC),
        trigger=CaptureTrigger.SAMPLED,
        rows=1,
        data_b64=data_b64,
    )


def test_an_upload_is_stored_once_and_acknowledged(
    start_control_plane: ControlPlaneFactory, broker: Mosquitto
) -> None:
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    good, bad = sample(archive(x)), sample(base64.b64encode(b"not a zip").decode())
    upload = CaptureUpload(device_id="store-box", samples=[good, bad]).model_dump_json().encode()
    device = ProbeClient(broker.port)
    assert device.connect() == 0
    try:
        device.subscribe(f"{TOPIC}/acks")
        with start_control_plane() as cp:
            path = "/api/v1/models/digits/versions/1/samples"
            for _ in range(2):  # sent again: the acknowledgement was lost, say
                device.publish(f"{TOPIC}/telemetry", upload)

            def acked() -> set[str]:
                ids: set[str] = set()
                for payload in device.messages(f"{TOPIC}/acks"):
                    ids |= set(getattr(FleetAck.validate_json(payload), "sample_ids", []))
                return ids

            device.wait(lambda: len(device.messages(f"{TOPIC}/acks")) >= 2, "two acks")
            assert acked() == {good.sample_id, bad.sample_id}
            listed = cp.admin.get(path).json()
            assert [s["sample_id"] for s in listed["samples"]] == [good.sample_id]
            assert listed["next"] is None
            (stored,) = listed["samples"]
            assert stored["device_id"] == "store-box" and stored["trigger"] == "sampled"
            data = cp.admin.get(f"{path}/{stored['id']}/data")
            assert data.status_code == 200
            with np.load(io.BytesIO(data.content), allow_pickle=False) as got:
                np.testing.assert_array_equal(got["input:input"], x)
            assert cp.admin.get(f"{path}/{stored['id'] + 100}/data").status_code == 404
            summary = cp.admin.get("/api/v1/models/digits/samples").json()
            assert summary["versions"][0]["samples"] == 1
            bad_page = cp.admin.get(path, params={"limit": 0})
            assert bad_page.status_code == 400 and "limit" in bad_page.text
    finally:
        device.close()
