"""The broker ``edgefleet fleet dynsec-config`` writes keeps the control plane's login apart
(issue 47): refused on the devices' listener, accepted on its own, where two replicas (each
its own client id, one shared subscription group) log in and administer the plugin; the
device users it makes there log in on the devices' listener. Run from the written files with a
real Mosquitto, which is also what checks that the plugin's state is one for both listeners
(control_plane/provisioning/dynsec_broker.py)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from pydantic import SecretStr

from control_plane.enrolment.dynsec import DynsecAdmin
from control_plane.provisioning.acl import CONTROL_PLANE_USER
from control_plane.provisioning.dynsec_broker import CONTROL_TOPIC
from control_plane.settings import ControlPlaneSettings
from tests.access.mqtt_client import NOT_AUTHORIZED, ProbeClient
from tests.mqtt_broker import WrittenMosquitto

T = "edgefleet/devices"


def admin(broker: WrittenMosquitto, state_dir: Path) -> DynsecAdmin:
    """The control plane's own admin path, configured as the command printed."""
    settings = ControlPlaneSettings(
        mqtt_url=broker.control_plane_url,
        mqtt_username=CONTROL_PLANE_USER,
        mqtt_password=SecretStr(password(state_dir)),
        state_dir=state_dir,
    )
    return DynsecAdmin(settings)


def password(state_dir: Path) -> str:
    return (state_dir / "mqtt" / f"{CONTROL_PLANE_USER}.password").read_text()


def plugin_users(broker: WrittenMosquitto) -> list[str]:
    doc = json.loads((broker.workdir / "data" / "dynamic-security.json").read_text())
    return [c["username"] for c in doc["clients"]]


def login(port: int, username: str, password: str, client_id: str | None = None) -> ProbeClient:
    client = ProbeClient(port, username=username, password=password, client_id=client_id)
    client.connect()
    return client


def test_the_control_planes_login_is_kept_to_its_own_listener(
    dynsec_broker: WrittenMosquitto, tmp_path: Path
) -> None:
    state = tmp_path / "cp-state"
    cp = {"username": CONTROL_PLANE_USER, "password": password(state)}
    second = login(dynsec_broker.port, **cp)
    replicas = [login(dynsec_broker.control_plane_port, client_id=f"cp-{n}", **cp) for n in "ab"]
    device: ProbeClient | None = None
    try:
        assert second.connack == NOT_AUTHORIZED  # a second client with its credentials
        assert [r.connack for r in replicas] == [0, 0]
        group = f"$share/edgefleet/{T}/+/telemetry"
        assert [r.subscribe(group)[0].value for r in replicas] == [1, 1]
        issued = asyncio.run(admin(dynsec_broker, state).issue("dev-1"))
        device = login(
            dynsec_broker.port, username="dev-1", password=issued, client_id="edgefleet-agent-dev-1"
        )
        assert device.connack == 0
        assert device.publish(f"{T}/dev-1/telemetry", b"{}").value == 0
        assert device.publish(CONTROL_TOPIC, b"{}").value == NOT_AUTHORIZED

        def delivered() -> int:
            return sum(len(r.messages(f"{T}/dev-1/telemetry")) for r in replicas)

        replicas[0].wait(delivered, "the telemetry at a replica")
        time.sleep(0.5)
        assert delivered() == 1  # one member of the group
        assert plugin_users(dynsec_broker) == ["dev-1"]
    finally:
        for client in [second, *replicas, *([device] if device else [])]:
            client.close()


def test_the_accounts_are_loaded_once_and_kept_across_a_restart(
    dynsec_broker: WrittenMosquitto, tmp_path: Path
) -> None:
    state = tmp_path / "cp-state"
    first = asyncio.run(admin(dynsec_broker, state).issue("dev-1"))
    dynsec_broker.stop()
    dynsec_broker.start()
    asyncio.run(admin(dynsec_broker, state).issue("dev-2"))
    # loaded twice (a file per listener), each user would be saved twice
    assert plugin_users(dynsec_broker) == ["dev-1", "dev-2"]
    assert (dynsec_broker.workdir / "data" / "dynamic-security.first-load.json").read_bytes() == b""
    device = login(
        dynsec_broker.port, username="dev-1", password=first, client_id="edgefleet-agent-dev-1"
    )
    second = login(dynsec_broker.port, username=CONTROL_PLANE_USER, password=password(state))
    try:
        assert device.connack == 0
        assert second.connack == NOT_AUTHORIZED
    finally:
        device.close()
        second.close()
