"""The edge overlays' broker and agent, run from the rendered manifests without a cluster.

The rendered mosquitto.conf (its TLS listener for the devices and its cluster listener for
the control plane) and the init container's script run as they are, on a real Mosquitto with
a certificate generated per test, in a temporary directory instead of the pod's volumes; a
real control plane makes device users in its dynamic security plugin; an agent runs the
rendered DaemonSet's settings (in this process, and as the image's own command with the
DaemonSet's whole environment) and enrols with a claim token placed where the claim Secret is
mounted. What is changed, and only that: the container paths point into the temporary
directory, the listeners bind free ports (127.0.0.1 for the broker), the agent's ``mqtts://``
URL names 127.0.0.1 and that port, and its enrol URL is the test control plane's (plain HTTP
on 127.0.0.1: the Ingress's TLS is not run here). No Kubernetes API server runs here.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from agent.fleet.enrol import identity_path
from agent.settings import AgentSettings
from control_plane.provisioning.dynsec_broker import find_plugin, initial_config
from control_plane.settings.enrolment import EnrolmentSettings
from tests.agent.server import copy_models, serve, wait_until
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.k3s.schema import ROOT, find, render
from tests.mqtt_broker import WrittenMosquitto, free_port
from tests.tls import TestCA

OVERLAY = "overlays/cpu"  # an edge overlay as users apply it; edge/ itself renders the same
PLUGIN = "/usr/lib/mosquitto_dynamic_security.so"  # where the eclipse-mosquitto image has it
CONTROL_PLANE_PASSWORD = "cp-" + uuid.uuid4().hex
DEVICE = "edge-node-7"
API_KEY = "key-" + uuid.uuid4().hex


def pod_spec(docs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, kind, name)["spec"]["template"]["spec"]
    return spec


def replace_once(text: str, old: str, new: str) -> str:
    """Rewrite one thing the test must change, failing if the manifest no longer has it."""
    assert text.count(old) == 1, f"{old!r} appears {text.count(old)} times"
    return text.replace(old, new)


@dataclass(frozen=True)
class EdgeBroker:
    broker: WrittenMosquitto
    ca: Path
    root: Path
    init_script: str

    def init(self) -> None:
        """The init container, as a new pod runs it (its emptyDir gone, its PVC kept)."""
        env = {**os.environ, "CONTROL_PLANE_PASSWORD": CONTROL_PLANE_PASSWORD}
        subprocess.run(["sh", "-ec", self.init_script], env=env, check=True, timeout=60)

    def recreate_pod(self) -> None:
        self.broker.stop()
        (self.root / "mosquitto/auth/passwd").unlink()
        self.init()
        self.broker.start()


@pytest.fixture
def edge_broker(tmp_path: Path) -> Iterator[EdgeBroker]:
    plugin = find_plugin()
    if plugin is None:
        pytest.skip("no mosquitto_dynamic_security.so here (Debian's mosquitto package has it)")
    docs = render(OVERLAY)
    data = find(docs, "ConfigMap", "edgefleet-mosquitto")["data"]
    spec = pod_spec(docs, "Deployment", "edgefleet-mosquitto")
    (container,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    root = tmp_path / "pod"
    for part in ("config", "auth", "data", "tls"):
        (root / "mosquitto" / part).mkdir(parents=True)
    # the edgefleet-mosquitto-tls Secret (kubernetes.io/tls: tls.crt, tls.key) as mounted
    ca = TestCA(tmp_path / "ca")
    issued = ca.issue("broker", server=True)
    shutil.copy(issued.cert, root / "mosquitto/tls/tls.crt")
    shutil.copy(issued.key, root / "mosquitto/tls/tls.key")
    tls_port, cp_port = free_port(), free_port()
    conf = data["mosquitto.conf"].replace("/mosquitto/", f"{root}/mosquitto/")
    conf = conf.replace(PLUGIN, str(plugin))
    conf = replace_once(conf, f"listener {ports['mqtts']}\n", f"listener {tls_port} 127.0.0.1\n")
    conf = replace_once(conf, f"listener {ports['mqtt']}\n", f"listener {cp_port} 127.0.0.1\n")
    if os.geteuid() == 0:  # as root, mosquitto would drop to a user that cannot read tmp_path
        conf = f"user {pwd.getpwuid(0).pw_name}\n" + conf
    (root / "mosquitto/config/mosquitto.conf").write_text(conf)
    (root / "mosquitto/config/acl").write_text(data["acl"])
    # the init container's script, as it is, on the pod's paths under root
    (init,) = spec["initContainers"]
    script = init["command"][2].replace("/mosquitto/", f"{root}/mosquitto/")
    broker = WrittenMosquitto(
        root / "mosquitto/config/mosquitto.conf",
        port=tls_port,
        control_plane_port=cp_port,
        log_path=tmp_path / "mosquitto.log",
    )
    edge = EdgeBroker(broker, ca.cert_path, root, script)
    edge.init()
    plugin_file = root / "mosquitto/data/dynamic-security.json"
    assert json.loads(plugin_file.read_text()) == initial_config()  # no user, nothing allowed
    broker.start()
    try:
        yield edge
    finally:
        broker.stop()


@pytest.fixture
def cluster_control_plane(tmp_path: Path, edge_broker: EdgeBroker) -> Iterator[RunningControlPlane]:
    """The control plane with the rendered broker settings, on the broker's cluster listener."""
    config = find(render(OVERLAY), "ConfigMap", "edgefleet-control-plane")["data"]
    assert urlsplit(config["EDGEFLEET_CP_MQTT_URL"]).port == 1883
    with control_plane(
        tmp_path / "cp-state",
        f"sqlite+aiosqlite:///{tmp_path}/cp.db",
        edge_broker.broker.control_plane_url,
        free_port(),
        mqtt_username=config["EDGEFLEET_CP_MQTT_USERNAME"],
        mqtt_password=CONTROL_PLANE_PASSWORD,
        enrolment=EnrolmentSettings(accounts=config["EDGEFLEET_CP_ENROLMENT__ACCOUNTS"]),
    ) as running:
        yield running


def rendered_agent_env(root: Path) -> dict[str, str]:
    """The DaemonSet agent's EDGEFLEET_AGENT_* environment as the kubelet builds it, with the
    node's name for the downward API and container paths moved under ``root``."""
    docs = render(OVERLAY)
    (container,) = pod_spec(docs, "DaemonSet", "edgefleet-agent")["containers"]
    env: dict[str, str] = {}
    for source in container["envFrom"]:
        env.update(find(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for var in container["env"]:
        if "valueFrom" in var:
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", var
            env[var["name"]] = DEVICE
        else:
            env[var["name"]] = var["value"]
    for name, value in env.items():
        if value.startswith(("/etc/edgefleet/", "/var/lib/edgefleet/", "/run/edgefleet/")):
            env[name] = f"{root}{value}"
    return env


def online(cp: RunningControlPlane, device_id: str) -> bool:
    resp = cp.admin.get(f"/api/v1/devices/{device_id}")
    return resp.status_code == 200 and bool(resp.json()["online"])


@pytest.mark.slow
def test_an_edge_agent_enrols_by_claim_and_joins_over_the_tls_listener(
    tmp_path: Path,
    example_repo: Path,
    edge_broker: EdgeBroker,
    cluster_control_plane: RunningControlPlane,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cp = cluster_control_plane
    root = tmp_path / "node"
    env = rendered_agent_env(root)
    assert "EDGEFLEET_AGENT_FLEET__USERNAME" not in env  # no shared broker user
    assert "EDGEFLEET_AGENT_FLEET__PASSWORD" not in env
    # the Secrets, as the kubelet mounts them: the claim token and the fleet's CA
    resp = cp.admin.post("/api/v1/claims", json={"name": "site", "max_uses": 5})
    assert resp.status_code == 201, resp.text
    token_file = Path(env["EDGEFLEET_AGENT_FLEET__CLAIM_TOKEN_FILE"])
    token_file.parent.mkdir(parents=True)
    token_file.write_text(resp.json()["token"] + "\n")  # as `kubectl create secret` from a file
    ca_file = Path(env["EDGEFLEET_AGENT_FLEET__TLS_CA_FILE"])
    assert env["SSL_CERT_FILE"] == str(ca_file)  # HTTPS (enrolment, artifacts) trusts it too
    ca_file.parent.mkdir(parents=True)
    shutil.copy(edge_broker.ca, ca_file)
    keys = Path(env["EDGEFLEET_AGENT_API_KEYS_FILE"])
    keys.parent.mkdir(parents=True)
    keys.write_text("camera:" + uuid.uuid4().hex + "\n")
    for name, value in env.items():
        if name.startswith("EDGEFLEET_AGENT_"):
            monkeypatch.setenv(name, value)
    rendered = AgentSettings()
    monkeypatch.undo()
    # the URL the edge node dials: the NodePort of the TLS Service; only its address changes
    url = urlsplit(rendered.fleet.mqtt_url or "")
    service = find(render(OVERLAY), "Service", "edgefleet-mosquitto-edge")
    (port,) = service["spec"]["ports"]
    assert (url.scheme, url.port) == ("mqtts", port["nodePort"])
    fleet = rendered.fleet.model_copy(
        update={
            "mqtt_url": f"mqtts://127.0.0.1:{edge_broker.broker.port}",
            "enrol_url": cp.url,
            # faster reconnects than a device's; nothing is asserted on time
            "reconnect_min_s": 0.05,
            "reconnect_max_s": 0.5,
        }
    )
    assert fleet.device_id == DEVICE and fleet.enrols
    repo = copy_models(example_repo, tmp_path / "models", "mlp")
    with serve(repo, fleet=fleet, profile=rendered.profile, runtime=rendered.runtime):
        wait_until(lambda: online(cp, DEVICE), what="the enrolled edge agent online over TLS")
    identity = json.loads(identity_path(fleet.state_dir).read_text())
    assert identity["username"] == DEVICE  # its own broker user, kept in its state directory
    assert str(fleet.state_dir).startswith(f"{root}/var/lib/edgefleet/")  # the node's hostPath
    (enrolment,) = cp.admin.get("/api/v1/enrolments").json()
    assert enrolment["device_id"] == DEVICE
    # A new broker pod (its init container run again on the same volume) keeps the device's
    # user, and the device its identity: with the claim revoked, it logs in as before.
    wait_until(lambda: not online(cp, DEVICE), what="the device offline")
    (claim,) = cp.admin.get("/api/v1/claims").json()
    assert cp.admin.post(f"/api/v1/claims/{claim['id']}/revoke").status_code == 200
    edge_broker.recreate_pod()
    with serve(repo, fleet=fleet, profile=rendered.profile, runtime=rendered.runtime):
        wait_until(lambda: online(cp, DEVICE), what="the device online after the broker's restart")
    assert cp.admin.get("/api/v1/enrolments").json() == [enrolment]


def agent_command() -> list[str]:
    """The agent image's ENTRYPOINT (packaging/containers/agent-*.Dockerfile), from this venv."""
    dockerfile = (ROOT / "packaging/containers/agent-cpu.Dockerfile").read_text()
    (entrypoint,) = re.findall(r"^ENTRYPOINT (.+)$", dockerfile, re.M)
    command: list[str] = json.loads(entrypoint)
    assert command[0] == "edgefleet"
    return [str(Path(sys.executable).with_name("edgefleet")), *command[1:]]


@pytest.mark.slow
def test_the_rendered_agent_command_enrols_and_serves_apps_on_loopback_and_its_socket(
    tmp_path: Path,
    example_repo: Path,
    edge_broker: EdgeBroker,
    cluster_control_plane: RunningControlPlane,
) -> None:
    """The container's command with the DaemonSet's whole environment: REST and gRPC on their
    ports (free ones here, not 8000 and 8001) and the gRPC socket on the node's path."""
    cp = cluster_control_plane
    root = tmp_path / "node"
    env = rendered_agent_env(root)
    resp = cp.admin.post("/api/v1/claims", json={"name": "site", "max_uses": 1})
    assert resp.status_code == 201, resp.text
    mounted = {
        env["EDGEFLEET_AGENT_FLEET__CLAIM_TOKEN_FILE"]: resp.json()["token"] + "\n",
        env["EDGEFLEET_AGENT_FLEET__TLS_CA_FILE"]: edge_broker.ca.read_text(),
        env["EDGEFLEET_AGENT_API_KEYS_FILE"]: f"camera:{API_KEY}\n",
    }
    for path, content in mounted.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)
    copy_models(example_repo, Path(env["EDGEFLEET_AGENT_MODEL_REPOSITORY"]), "mlp")
    uds = Path(env["EDGEFLEET_AGENT_GRPC__UDS"])
    uds.parent.mkdir(parents=True)  # the hostPath, made by the kubelet (DirectoryOrCreate)
    uds.parent.chmod(0o750)  # as the host-dirs init container leaves it
    port, grpc_port = free_port(), free_port()
    env |= {
        "EDGEFLEET_AGENT_PORT": str(port),
        "EDGEFLEET_AGENT_GRPC__PORT": str(grpc_port),
        "EDGEFLEET_AGENT_FLEET__MQTT_URL": f"mqtts://127.0.0.1:{edge_broker.broker.port}",
        "EDGEFLEET_AGENT_FLEET__ENROL_URL": cp.url,
        "HOME": str(tmp_path / "home"),
    }
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("EDGEFLEET_")}
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(agent_command(), env=inherited | env, stdout=out, stderr=out)
    try:
        wait_until(lambda: online(cp, DEVICE), what="the agent process enrolled and online")
        headers = {"Authorization": f"Bearer {API_KEY}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as rest:
            wait_until(
                lambda: rest.get("/v2/models/mlp/ready", headers=headers).status_code == 200,
                what="mlp ready over REST",
            )
            assert rest.get("/v2/models/mlp/ready").status_code == 401  # the keys are on
        wait_until(uds.is_socket, what="the gRPC socket on the node's path")
        assert stat.S_IMODE(uds.stat().st_mode) == 0o660  # the group of docs/kubernetes.md
        grpc = pytest.importorskip("tritonclient.grpc")
        client = grpc.InferenceServerClient(f"unix:{uds}")
        try:
            assert client.is_model_ready("mlp", headers={"authorization": f"Bearer {API_KEY}"})
        finally:
            client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    identity = json.loads(identity_path(Path(env["EDGEFLEET_AGENT_FLEET__STATE_DIR"])).read_text())
    assert identity["username"] == DEVICE, log.read_text()[-2000:]


@pytest.mark.slow
def test_the_control_planes_login_is_refused_on_the_devices_tls_listener(
    edge_broker: EdgeBroker,
) -> None:
    def publish(port: int, *tls: str) -> subprocess.CompletedProcess[str]:
        cli = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-t", "edgefleet/x"]
        cli += ["-m", "x", "-u", "control-plane", "-P", CONTROL_PLANE_PASSWORD, *tls]
        return subprocess.run(cli, capture_output=True, text=True, timeout=30, check=False)

    broker = edge_broker.broker
    assert publish(broker.control_plane_port).returncode == 0  # its own listener takes it
    refused = publish(broker.port, "--cafile", str(edge_broker.ca))
    assert refused.returncode != 0
    assert "not authori" in refused.stderr.lower(), refused.stderr
    # and the TLS listener speaks only TLS
    plain = subprocess.run(
        ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-t", "x", "-m", "x"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert plain.returncode != 0
