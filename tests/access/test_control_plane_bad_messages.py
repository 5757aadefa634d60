"""Garbage on every topic the control plane subscribes to (every device's status, telemetry and
events), on a real Mosquitto and a real control plane (SQLite and PostgreSQL): each message is
refused with a reason code, logged, counted, and valid telemetry, even in the same ingest batch,
is still stored."""

from __future__ import annotations

import json
import logging
import random
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.access.metrics import counts, value
from tests.access.mqtt_client import ProbeClient
from tests.agent.server import wait_until
from tests.control_plane.conftest import ControlPlaneFactory
from tests.control_plane.test_rollouts import wait_devices
from tests.mqtt_broker import Mosquitto

LIMIT = 64 * 1024
REJECTED = "edgefleet_messages_rejected_total"
NOW = datetime.now(UTC).isoformat()


def status(device_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "device_id": device_id,
        "online": True,
        "agent_version": "test",
        "hardware_profile": "generic-x86_64",
        "labels": {},
        "models": [],
        **fields,
    }


def telemetry(device_id: str, seq: int, **fields: Any) -> dict[str, Any]:
    model = {"model": "mlp", "version": 1, "requests": 10, "errors": 0, "rows": 10, "batches": 2}
    return {
        "schema_version": 1,
        "device_id": device_id,
        "seq": seq,
        "time": NOW,
        "window_s": 1.0,
        "models": [model],
        **fields,
    }


def event(device_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "device_id": device_id,
        "event_id": uuid.uuid4().hex,
        "time": NOW,
        "model": "mlp",
        "state": "received",
        **fields,
    }


def js(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def cases() -> list[tuple[str, bytes, str]]:
    """(leaf, payload, expected code), all published by (or as) device dev-x."""
    noise = random.Random(8).randbytes(700)
    deep = b"[" * 50_000
    oversize = b'{"x": "' + b"a" * LIMIT + b'"}'
    out: list[tuple[str, bytes, str]] = []
    valid = {
        "status": status("dev-x"),
        "telemetry": telemetry("dev-x", 1),
        "events": event("dev-x"),
    }
    for leaf, good in valid.items():
        out += [
            (leaf, noise, "malformed"),
            (leaf, oversize, "oversize"),
            (leaf, b'{"hello": "world"}', "malformed"),
            (leaf, deep, "malformed"),
            (leaf, js({**good, "schema_version": 2}), "unsupported_schema"),
            (leaf, js({**good, "device_id": "dev-ok"}), "wrong_device"),  # dev-x posing as dev-ok
        ]
    nan_window = js(telemetry("dev-x", 3)).replace(b'"window_s": 1.0', b'"window_s": NaN')
    negative_rows = js(telemetry("dev-x", 4)).replace(b'"rows": 10', b'"rows": -10')
    out += [  # valid by the schema, but values the database would refuse
        ("status", js(status("dev-x", hardware_profile="p" * 500)), "out_of_range"),
        ("status", js(status("dev-x", trust_root_version=2**31)), "out_of_range"),
        ("telemetry", js(telemetry("dev-x", 2**70)), "out_of_range"),
        ("telemetry", nan_window, "out_of_range"),
        ("events", js(event("dev-x", event_id="e" * 500)), "out_of_range"),
        ("events", js(event("dev-x", version=2**40)), "out_of_range"),
        ("telemetry", negative_rows, "out_of_range"),
    ]
    return out


def test_garbage_on_every_control_plane_topic_is_refused_counted_and_logged(
    start_control_plane: ControlPlaneFactory, broker: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    device = ProbeClient(broker.port)
    assert device.connect() == 0
    # retained garbage is waiting when the control plane subscribes
    device.publish("edgefleet/devices/dev-x/status", b"\xff\xfe retained", retain=True)
    bad = cases()
    expected = Counter((leaf, code) for leaf, _, code in bad)
    expected.update([("status", "malformed"), ("unknown", "wrong_topic")])
    try:
        with caplog.at_level(logging.INFO), start_control_plane(mqtt_max_message_bytes=LIMIT) as cp:
            for i, (leaf, payload, _) in enumerate(bad):
                device.publish(f"edgefleet/devices/dev-x/{leaf}", payload)
                # valid telemetry interleaved with the garbage shares its ingest batches
                device.publish("edgefleet/devices/dev-ok/telemetry", js(telemetry("dev-ok", i + 1)))
            device.publish("edgefleet/devices/not a device/status", js(status("not a device")))
            device.publish("edgefleet/devices/dev-ok/status", js(status("dev-ok")))

            def rejected() -> Counter[tuple[str, str]]:
                return counts(cp.admin.get("/metrics").text, REJECTED)

            wait_until(lambda: rejected().total() >= expected.total(), what="every rejection")
            assert rejected() == expected
            logged = [r for r in caplog.records if r.getMessage() == "device message rejected"]
            assert Counter((r.topic, r.code) for r in logged) == expected  # type: ignore[attr-defined]
            assert all(r.reason for r in logged)  # type: ignore[attr-defined]

            # every valid message was stored, and the device that sent garbage is unknown
            def telemetry_stored() -> float:
                return value(cp.admin.get("/metrics").text, "edgefleet_telemetry_messages_total")

            wait_until(lambda: telemetry_stored() >= len(bad), what="the valid telemetry")
            assert telemetry_stored() == len(bad)
            wait_devices(cp, "dev-ok")  # its birth message, published last
            assert "dev-x" not in {d["id"] for d in cp.admin.get("/api/v1/devices").json()}
            assert cp.services.bus.connected.is_set()
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        device.close()


def test_a_message_the_database_refuses_costs_no_other_message(
    start_control_plane: ControlPlaneFactory, broker: Mosquitto, db_url: str
) -> None:
    """A message that passes every check but the database's own (a NUL byte in a model name:
    PostgreSQL refuses it, SQLite stores it) fails its batch: the batch's messages are then
    written one by one, so the other devices' telemetry is stored, and the refused one is
    counted and acknowledged to its device, which would otherwise send it again for days."""
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite stores the NUL byte that PostgreSQL refuses")
    acks = "edgefleet/devices/dev-poison/acks"
    device = ProbeClient(broker.port)
    assert device.connect() == 0
    device.subscribe(acks)
    poison = telemetry("dev-poison", 7)
    poison["models"][0]["model"] = "ml\x00p"
    try:
        with start_control_plane(telemetry_ack_interval_s=0.2) as cp:
            for seq in range(1, 11):
                device.publish("edgefleet/devices/dev-ok/telemetry", js(telemetry("dev-ok", seq)))
                if seq == 5:
                    device.publish("edgefleet/devices/dev-poison/telemetry", js(poison))

            def stored() -> float:
                return value(cp.admin.get("/metrics").text, "edgefleet_telemetry_messages_total")

            wait_until(lambda: stored() >= 10, what="every valid message")
            assert counts(cp.admin.get("/metrics").text, REJECTED)[("ingest", "write_failed")] >= 1
            acked = device.wait(lambda: device.messages(acks), "the refused message acknowledged")
            assert json.loads(acked[-1])["seqs"] == [[7, 7]]
            assert cp.services.bus.connected.is_set()
    finally:
        device.close()
