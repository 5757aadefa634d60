"""The config twin end to end: a label group's twin and a device's own, set through the API
and the CLI, signed by the control plane, applied by a real agent over a real Mosquitto
(live settings at once, the others at its next start), reported back and compared; a bad
value is refused with its reason while the rest applies; a twin not signed by the fleet is
refused; on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import paho.mqtt.publish as mqtt_publish

from common.protocol.messages import DesiredState
from common.protocol.signing import SigningKey, sign_envelope
from common.protocol.twin import ConfigTwin
from tests.agent.server import RunningAgent, wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_operations import edgefleet
from tests.control_plane.test_rollouts import wait_devices
from tests.mqtt_broker import Mosquitto


def twin(cp: RunningControlPlane, device_id: str) -> dict[str, Any]:
    resp = cp.admin.get(f"/api/v1/devices/{device_id}/twin")
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = resp.json()
    return doc


def reported(cp: RunningControlPlane, device_id: str) -> dict[str, Any]:
    """The device's twin view once it reports the version desired."""

    def caught_up() -> bool:
        doc = twin(cp, device_id)
        rep = doc["reported"]
        return rep is not None and rep["version"] == doc["desired"]["version"]

    wait_until(caught_up, timeout_s=60, what=f"{device_id} to report its twin")
    return twin(cp, device_id)


def app_keys(agent: RunningAgent) -> dict[str, Any]:
    resp = agent.client.get("/v2/edgefleet/config")
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = resp.json()
    return doc


def by_key(diff: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["key"]: d for d in diff}


def test_a_twin_is_applied_live_or_at_restart_and_reported(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, broker: Mosquitto
) -> None:
    root = logging.getLogger()
    level = root.level
    try:
        with start_control_plane() as cp:
            operator = cp.token("operator")
            group = cp.admin.put(
                "/api/v1/twins",
                json={
                    "selector": {"site": "lab"},
                    "set": {
                        "log_level": "DEBUG",
                        "app.camera_url": "rtsp://cam-1/s",
                        "app.threshold": 0.5,
                    },
                },
            )
            assert group.status_code == 200, group.text
            assert group.json()["signed_for"] == []  # no device yet
            with start_agent("dev-a", cp) as agent:
                wait_devices(cp, "dev-a")
                _group_device_and_bad_values(cp, operator, agent)
                _forged_twin_refused(cp, agent, broker)
            # the setting read at start takes effect now, from the twin kept on disk
            with start_agent("dev-a", cp) as agent:
                assert app_keys(agent)["app"]["threshold"] == 0.8  # before the broker is heard
                wait_until(
                    lambda: (
                        twin(cp, "dev-a")["diff"] == []
                        and (twin(cp, "dev-a")["reported"] or {}).get("pending_restart") == {}
                    ),
                    timeout_s=60,
                    what="dev-a in sync after its restart",
                )
                big = agent.client.post("/v2/models/mlp/infer", content=b"x" * 8192)
                assert big.status_code == 413, big.text
                shown = edgefleet(cp, operator, "devices", "twin", "dev-a")
                assert shown.returncode == 0, shown.stderr
                assert "in sync: reported == desired" in shown.stdout, shown.stdout
                # out of the group by an operator's label: its keys leave the device's twin
                moved = edgefleet(cp, operator, "devices", "label", "dev-a", "site=attic")
                assert moved.returncode == 0, moved.stderr
                doc = reported(cp, "dev-a")
                assert "log_level" not in doc["desired"]["settings"], doc
                assert app_keys(agent)["app"] == {"threshold": 0.8, "mode": "day"}
    finally:
        root.setLevel(level)


def _group_device_and_bad_values(
    cp: RunningControlPlane, operator: str, agent: RunningAgent
) -> None:
    # set before the device joined: it gets it when it comes online
    doc = reported(cp, "dev-a")
    assert doc["desired"]["app"] == {"camera_url": "rtsp://cam-1/s", "threshold": 0.5}, doc
    # the device's own twin wins key by key; a key this agent does not take is refused
    out = edgefleet(
        cp,
        operator,
        *("twin", "set", "--device", "dev-a", "telemetry_interval_s=0.5"),
        *("max_request_bytes=4096", "app.threshold=0.8", "turbo=true"),
    )
    assert out.returncode == 0, out.stderr
    assert "signed for 1 device(s): dev-a" in out.stdout, out.stdout
    doc = reported(cp, "dev-a")
    assert doc["desired"]["settings"] == {
        "log_level": "DEBUG",
        "telemetry_interval_s": 0.5,
        "max_request_bytes": 4096,
        "turbo": True,
    }
    diff = by_key(doc["diff"])
    assert set(diff) == {"max_request_bytes", "turbo"}, doc["diff"]
    assert diff["max_request_bytes"]["state"] == "pending_restart"
    assert diff["turbo"]["state"] == "rejected" and "unknown setting" in diff["turbo"]["reason"]
    # live: the log level, the telemetry timer (its birth message says so), the app keys
    assert logging.getLogger().level == logging.DEBUG
    device = cp.admin.get("/api/v1/devices/dev-a").json()
    assert device["telemetry_interval_s"] == 0.5, device
    assert app_keys(agent)["app"] == {"camera_url": "rtsp://cam-1/s", "threshold": 0.8}

    # a bad value is refused with its reason; the rest of the same twin applies
    bad = cp.admin.put(
        "/api/v1/twins",
        json={
            "device": "dev-a",
            "set": {"telemetry_interval_s": "fast", "app.mode": "night"},
            "unset": ["turbo"],
        },
    )
    assert bad.status_code == 200, bad.text
    doc = reported(cp, "dev-a")
    diff = by_key(doc["diff"])
    assert set(diff) == {"max_request_bytes", "telemetry_interval_s"}, doc["diff"]
    assert diff["telemetry_interval_s"]["state"] == "rejected"
    assert "bad value 'fast'" in diff["telemetry_interval_s"]["reason"]
    assert app_keys(agent)["app"]["mode"] == "night"
    assert agent.state.fleet is not None and agent.state.fleet._telemetry_interval_s() == 0.5
    fixed = cp.admin.put(
        "/api/v1/twins", json={"device": "dev-a", "set": {"telemetry_interval_s": 0.5}}
    )
    assert fixed.status_code == 200, fixed.text
    assert set(by_key(reported(cp, "dev-a")["diff"])) == {"max_request_bytes"}
    shown = edgefleet(cp, operator, "devices", "twin", "dev-a")
    assert shown.returncode == 0, shown.stderr
    assert "max_request_bytes        pending_restart" in shown.stdout, shown.stdout

    # a name beyond a setting's form is the control plane's 400, naming the field
    refused = cp.admin.put("/api/v1/twins", json={"device": "dev-a", "set": {"Bad Key": 1}})
    assert refused.status_code == 400 and "Bad Key" in refused.text, refused.text


def _forged_twin_refused(cp: RunningControlPlane, agent: RunningAgent, broker: Mosquitto) -> None:
    fleet = agent.state.fleet
    assert fleet is not None
    version = fleet.twin.version
    assert version is not None
    forged = ConfigTwin(
        kind="config_twin",
        device_id="dev-a",
        version=version + 1,
        settings={"log_level": "ERROR"},
        app={"camera_url": "rtsp://attacker/s"},
        issued_at=datetime.now(UTC),
    )
    envelope = sign_envelope(forged.model_dump(mode="json"), SigningKey.generate())
    desired = DesiredState(
        device_id="dev-a", issued_at=datetime.now(UTC), manifests=[envelope.model_dump()]
    )
    refused = fleet.metrics.fleet_rejected.labels("desired", "unknown_key")
    before = refused._value.get()
    mqtt_publish.single(
        "edgefleet/devices/dev-a/desired",
        desired.model_dump_json(),
        qos=1,
        retain=True,
        hostname="127.0.0.1",
        port=broker.port,
    )
    wait_until(lambda: refused._value.get() > before, what="the forged twin refused")
    assert fleet.twin.version == version
    assert app_keys(agent)["app"]["camera_url"] == "rtsp://cam-1/s"
    assert logging.getLogger().level == logging.DEBUG

    def reported_refusal() -> bool:
        events = cp.admin.get("/api/v1/devices/dev-a/events").json()
        items = events if isinstance(events, list) else events.get("events", [])
        return any(e.get("model") == "@twin" and e.get("code") == "unknown_key" for e in items)

    wait_until(reported_refusal, timeout_s=30, what="the refusal among dev-a's events")
    # the control plane's retained twin back (as a republish after a broker reset does)
    cp.admin.put("/api/v1/twins", json={"device": "dev-a", "set": {"app.mode": "day"}})
    wait_until(lambda: app_keys(agent)["app"].get("mode") == "day", what="the fleet's twin again")
    assert json.loads(json.dumps(twin(cp, "dev-a")["desired"]["app"]))["mode"] == "day"
