"""Flow control between the broker and the control plane's ingest, on a real Mosquitto and a
real control plane (SQLite and PostgreSQL): when device messages arrive faster than batches are
written, the control plane stops reading (the broker holds the rest) and stores every one."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from tests.access.metrics import value
from tests.access.mqtt_client import ProbeClient
from tests.agent.server import wait_until
from tests.control_plane.conftest import ControlPlaneFactory
from tests.mqtt_broker import Mosquitto

MESSAGES = 1500


@pytest.mark.slow
def test_a_full_ingest_queue_pauses_reading_and_loses_nothing(
    start_control_plane: ControlPlaneFactory, broker: Mosquitto
) -> None:
    device = ProbeClient(broker.port)
    device.client.max_inflight_messages_set(1000)  # a burst, not one message per round trip
    assert device.connect() == 0
    now = datetime.now(UTC).isoformat()
    # batches of 5 rows: reading pauses once 20 wait; the Receive Maximum lets 1,000 through
    settings = {"ingest_batch_size": 5, "mqtt_broker_inflight": 1000}
    try:
        with start_control_plane(**settings) as cp:
            for seq in range(1, MESSAGES + 1):
                doc = {
                    "schema_version": 1,
                    "device_id": "dev-1",
                    "seq": seq,
                    "time": now,
                    "window_s": 1.0,
                    "models": [],
                }
                device.client.publish("edgefleet/devices/dev-1/telemetry", json.dumps(doc), qos=1)

            def metric(name: str) -> float:
                return value(cp.admin.get("/metrics").text, name)

            wait_until(
                lambda: metric("edgefleet_telemetry_messages_total") >= MESSAGES,
                timeout_s=120,
                what="every telemetry message stored",
            )
            assert metric("edgefleet_telemetry_messages_total") == MESSAGES
            assert metric("edgefleet_mqtt_read_pauses_total") >= 1
            # exported; 1,500 messages are far from the 65,535 packet ids a broker can reuse
            assert metric("edgefleet_mqtt_reused_packet_ids_total") == 0
            # every batch is counted with its size and how long its write took
            batches = metric("edgefleet_ingest_batch_messages_count")
            assert metric("edgefleet_ingest_batch_messages_sum") == MESSAGES
            assert batches >= MESSAGES / 5
            assert metric("edgefleet_ingest_batch_seconds_count") == batches
            assert metric("edgefleet_ingest_batch_seconds_sum") > 0
            assert cp.services.ingestor.queued == 0
            # reading resumed once the queue drained
            assert metric("edgefleet_mqtt_reading_paused") == 0
    finally:
        device.close()
