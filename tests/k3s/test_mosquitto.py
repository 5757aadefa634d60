"""The broker's manifests on a real Mosquitto: the rendered mosquitto.conf and ACL, and the
password file made by the Deployment's own init script. Agents may only report and listen;
the control plane may do everything; nobody gets in without a password."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from tests.agent.server import wait_until
from tests.k3s.schema import find, render
from tests.mqtt_broker import free_port, stop_paho

PASSWORDS = {"control-plane": "cp-" + uuid.uuid4().hex, "agent": "agent-" + uuid.uuid4().hex}


class Client:
    def __init__(self, port: int, username: str, password: str) -> None:
        self.received: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=f"t-{uuid.uuid4().hex[:8]}"
        )
        self.client.username_pw_set(username, password)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        wait_until(self.client.is_connected, what=f"{username} to connect")

    def _on_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.received.append((msg.topic, bytes(msg.payload)))

    def topics(self) -> list[str]:
        with self._lock:
            return [t for t, _ in self.received]

    def subscribe(self, topic: str) -> None:
        result, mid = self.client.subscribe(topic, qos=1)
        assert result == mqtt.MQTT_ERR_SUCCESS

    def publish(self, topic: str, payload: str, retain: bool = False) -> None:
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(timeout=10)

    def close(self) -> None:
        stop_paho(self.client)


@pytest.fixture
def broker_port(tmp_path: Path) -> Iterator[int]:
    # the cluster overlay's broker: agents in the cluster share its agent user (the edge
    # overlays' broker, with a user per device, is tests/k3s/test_edge_broker.py's)
    docs = render("overlays/cluster")
    data = find(docs, "ConfigMap", "edgefleet-mosquitto")["data"]
    spec = find(docs, "Deployment", "edgefleet-mosquitto")["spec"]["template"]["spec"]
    port = free_port()
    for part in ("config", "auth", "data"):
        (tmp_path / part).mkdir()
    conf = data["mosquitto.conf"].replace("/mosquitto/", f"{tmp_path}/")
    conf = conf.replace("listener 1883\n", f"listener {port} 127.0.0.1\n")
    if os.geteuid() == 0:  # as root, mosquitto would drop to a user that cannot read tmp_path
        conf = f"user {pwd.getpwuid(0).pw_name}\n" + conf
    (tmp_path / "config" / "mosquitto.conf").write_text(conf)
    (tmp_path / "config" / "acl").write_text(data["acl"])
    # the init container's script, as it is, against tmp_path instead of /mosquitto
    (init,) = spec["initContainers"]
    script = init["command"][2].replace("/mosquitto/auth", str(tmp_path / "auth"))
    env = {
        **os.environ,
        "CONTROL_PLANE_PASSWORD": PASSWORDS["control-plane"],
        "AGENT_PASSWORD": PASSWORDS["agent"],
    }
    subprocess.run(["sh", "-ec", script], env=env, check=True, timeout=60)
    passwd = (tmp_path / "auth" / "passwd").read_text()
    assert PASSWORDS["agent"] not in passwd and "agent:$" in passwd  # hashed, never plain
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    proc = subprocess.Popen(
        [exe, "-c", str(tmp_path / "config" / "mosquitto.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def accepting() -> bool:
        assert proc.poll() is None, "mosquitto exited: its rendered configuration is refused"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    try:
        wait_until(accepting, what="mosquitto with the rendered configuration")
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.slow
def test_the_acl_lets_agents_report_and_listen_only(broker_port: int) -> None:
    cp = Client(broker_port, "control-plane", PASSWORDS["control-plane"])
    agent = Client(broker_port, "agent", PASSWORDS["agent"])
    try:
        cp.subscribe("edgefleet/#")
        agent.subscribe("edgefleet/devices/node-1/desired")
        agent.subscribe("edgefleet/devices/node-1/commands")
        agent.subscribe("edgefleet/fleet/trust")
        # agents may not publish what only the control plane may: desired state, trust root
        agent.publish("edgefleet/devices/node-1/desired", "forged")
        agent.publish("edgefleet/fleet/trust", "forged")
        agent.publish("edgefleet/devices/node-1/status", "online")
        agent.publish("edgefleet/devices/node-1/events", "last")
        wait_until(lambda: "edgefleet/devices/node-1/events" in cp.topics(), what="the event")
        assert cp.topics() == ["edgefleet/devices/node-1/status", "edgefleet/devices/node-1/events"]
        # the control plane publishes to the device; the device reads it
        cp.publish("edgefleet/devices/node-1/desired", "manifest", retain=True)
        cp.publish("edgefleet/fleet/trust", "root", retain=True)
        wait_until(lambda: len(agent.received) == 2, what="desired state and trust root")
        assert sorted(agent.received) == [
            ("edgefleet/devices/node-1/desired", b"manifest"),
            ("edgefleet/fleet/trust", b"root"),
        ]
        # reading other devices' reports is the control plane's business only
        agent.subscribe("edgefleet/devices/+/telemetry")
        cp.publish("edgefleet/devices/node-2/telemetry", "secret")
        cp.publish("edgefleet/devices/node-1/commands", "rollback")
        wait_until(lambda: "edgefleet/devices/node-1/commands" in agent.topics(), what="command")
        assert "edgefleet/devices/node-2/telemetry" not in agent.topics()  # sent before it
    finally:
        agent.close()
        cp.close()


@pytest.mark.parametrize(
    "credentials",
    [[], ["-u", "agent", "-P", "wrong"], ["-u", "nobody", "-P", "x"]],
    ids=["anonymous", "wrong-password", "unknown-user"],
)
def test_nobody_connects_without_a_password(broker_port: int, credentials: list[str]) -> None:
    done = subprocess.run(
        [
            "mosquitto_pub",
            "-h",
            "127.0.0.1",
            "-p",
            str(broker_port),
            "-t",
            "edgefleet/x",
            "-m",
            "x",
            *credentials,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0
    assert "not authori" in done.stderr.lower() or "refused" in done.stderr.lower(), done.stderr
