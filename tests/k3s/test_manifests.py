"""Every overlay renders with kubectl kustomize and validates against the Kubernetes schemas;
what the manifests say matches the code they deploy (settings names, health routes, metric)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel
from pydantic_settings import BaseSettings

from agent.api.v2 import router as v2_router
from agent.settings import AgentSettings
from control_plane.settings import ControlPlaneSettings
from tests.agent.server import copy_models, serve
from tests.k3s.schema import K3S, KUBERNETES_VERSION, OVERLAYS, ROOT, find, kubectl, render

CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "RuntimeClass",
    "ClusterRole",
    "ClusterRoleBinding",
}
WORKLOADS = ("Deployment", "DaemonSet")


def pod_specs(docs: tuple[dict[str, Any], ...]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in WORKLOADS
    ]


def agent_workload(overlay: str) -> dict[str, Any]:
    docs = render(overlay)
    kind = "Deployment" if overlay.endswith("cluster") else "DaemonSet"
    return find(docs, kind, "edgefleet-agent")


@pytest.mark.slow
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates_against_the_kubernetes_schemas(overlay: str) -> None:
    docs = render(overlay)
    failures = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}")
    assert not failures
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "NetworkPolicy", "Role", "PersistentVolumeClaim"} <= kinds
    for doc in docs:
        namespace = doc["metadata"].get("namespace")
        assert namespace == (None if doc["kind"] in CLUSTER_SCOPED else "edgefleet"), doc["kind"]


def test_a_broken_manifest_fails_validation() -> None:
    """The check above can fail: a typo in a DaemonSet field is caught."""
    ds = agent_workload("overlays/cpu")
    ds["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["prot"] = 8000
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_non_root_on_a_read_only_root_without_capabilities(
    overlay: str,
) -> None:
    for where, spec in pod_specs(render(overlay)):
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        for container in spec.get("initContainers", []) + spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True, (where, container["name"])
            assert ctx["allowPrivilegeEscalation"] is False, (where, container["name"])
            assert ctx["capabilities"]["drop"] == ["ALL"], (where, container["name"])
            limits, requests = container["resources"]["limits"], container["resources"]["requests"]
            assert {"cpu", "memory"} <= limits.keys() & requests.keys(), (where, container["name"])
            if container["name"] == "host-dirs":
                # the one root step: chown the hostPath directories, with CAP_CHOWN only
                assert ctx["runAsUser"] == 0 and ctx["capabilities"]["add"] == ["CHOWN"]
            else:
                assert "add" not in ctx["capabilities"] and ctx.get("runAsUser", 1) != 0


def test_edge_agent_runs_on_edge_nodes_only_and_tolerates_their_taint() -> None:
    spec = agent_workload("edge")["spec"]["template"]["spec"]
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "node-role.kubernetes.io/edge", "operator": "Exists"} in term["matchExpressions"]
    assert {
        "key": "node-role.kubernetes.io/edge",
        "operator": "Exists",
        "effect": "NoSchedule",
    } in spec["tolerations"]
    store = next(v for v in spec["volumes"] if v["name"] == "store")
    assert store["hostPath"]["path"] == "/var/lib/edgefleet"
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert {"/var/lib/edgefleet/models", "/var/lib/edgefleet/state", "/etc/edgefleet/trust"} <= (
        mounts
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_probes_use_the_agent_health_routes(overlay: str) -> None:
    routes = {getattr(r, "path", None) for r in v2_router.routes}
    (container,) = agent_workload(overlay)["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert {"/v2/health/live", "/v2/health/ready"} <= routes
    assert container["ports"][0]["containerPort"] == 8000


def _field_exists(model: type[BaseModel], path: list[str]) -> bool:
    field = model.model_fields.get(path[0])
    if field is None:
        return False
    if len(path) == 1:
        return True
    nested = field.annotation
    return (
        isinstance(nested, type)
        and issubclass(nested, BaseModel)
        and _field_exists(nested, path[1:])
    )


def _environment(docs: tuple[dict[str, Any], ...], container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet builds it; secrets and the downward API
    get stand-in values."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(find(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for var in container.get("env", []):
        env[var["name"]] = var.get("value", "node-1" if "valueFrom" in var else "")
    return env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_settings_in_the_manifests_are_the_agent_and_control_plane_settings(
    overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(overlay)
    checks: list[tuple[dict[str, Any], str, type[BaseSettings]]] = [
        (agent_workload(overlay), "EDGEFLEET_AGENT_", AgentSettings),
        (
            find(docs, "Deployment", "edgefleet-control-plane"),
            "EDGEFLEET_CP_",
            ControlPlaneSettings,
        ),
    ]
    for workload, prefix, settings_cls in checks:
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        env = _environment(docs, container)
        names = [n for n in env if n.startswith(prefix)]
        assert names
        for name in names:
            path = name.removeprefix(prefix).lower().split("__")
            assert _field_exists(settings_cls, path), f"{name} is not a setting"
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        settings = settings_cls()
        monkeypatch.undo()
        if isinstance(settings, AgentSettings):
            assert settings.host == "0.0.0.0" and settings.port == 8000
            # listening beyond loopback, it needs its keys: a file of the Secret's, mounted
            assert settings.api_keys_file is not None and settings.api_key is None
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
            keys_volume = volumes[mounts[str(settings.api_keys_file.parent)]]
            assert keys_volume["secret"]["secretName"] == "edgefleet-agent-api-keys"
            assert "/metrics" in settings.api_key_open_paths  # Prometheus scrapes it
            assert settings.fleet.enabled and settings.fleet.device_id == "node-1"
            assert settings.fleet.labels["runtime"] == "kubernetes"
            profile = settings.profile
            assert profile == "auto" or (ROOT / "hardware_profiles" / f"{profile}.toml").is_file()
        else:
            assert isinstance(settings, ControlPlaneSettings)
            assert settings.kubernetes.enabled
            # the cluster overlay's agent is a Deployment: no DaemonSet to guard
            assert settings.kubernetes.agent_daemonset == (
                None if overlay.endswith("cluster") else "edgefleet-agent"
            )
            assert settings.mqtt_username == "control-plane"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_control_plane_may_get_nodes_and_nothing_else_cluster_wide(overlay: str) -> None:
    """The DaemonSet guard reads an unhealthy agent pod's node (an offline node is not the
    upgrade's fault); everything else the control plane does stays in its namespace."""
    docs = render(overlay)
    role = find(docs, "ClusterRole", "edgefleet-control-plane-nodes")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    binding = find(docs, "ClusterRoleBinding", "edgefleet-control-plane-nodes")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = find(docs, "ServiceAccount", "edgefleet-control-plane")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    cluster_wide = [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    assert cluster_wide == [role, binding]


def test_a_misspelt_setting_is_caught() -> None:
    assert not _field_exists(AgentSettings, ["fleet", "mqtt_uri"])
    assert _field_exists(AgentSettings, ["fleet", "mqtt_url"])


def test_hardware_overlays_request_their_devices() -> None:
    def agent(overlay: str) -> tuple[dict[str, Any], dict[str, Any]]:
        spec = agent_workload(overlay)["spec"]["template"]["spec"]
        return spec, spec["containers"][0]

    spec, cpu = agent("overlays/cpu")
    assert cpu["image"] == "ghcr.io/edgefleet/agent:0.1.0-cpu"
    assert set(cpu["resources"]["limits"]) == {"cpu", "memory"}
    assert "runtimeClassName" not in spec
    spec, intel = agent("overlays/intel")
    assert intel["image"] == "ghcr.io/edgefleet/agent:0.1.0-intel"
    for resources in (intel["resources"]["limits"], intel["resources"]["requests"]):
        assert resources["gpu.intel.com/i915"] == "1" and resources["npu.intel.com/accel"] == "1"
    for overlay in ("overlays/jetson", "overlays/cluster"):
        spec, gpu = agent(overlay)
        assert gpu["image"] == "ghcr.io/edgefleet/agent:0.1.0-jetson"
        assert spec["runtimeClassName"] == "nvidia"
        assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert find(render(overlay), "RuntimeClass", "nvidia")["handler"] == "nvidia"
        # the edge term survives the overlay's patch of the node affinity
    (term,) = agent("overlays/jetson")[0]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert {e["key"] for e in term["matchExpressions"]} == {
        "node-role.kubernetes.io/edge",
        "kubernetes.io/arch",
    }


def test_control_plane_keeps_sqlite_on_its_volume_or_takes_postgresql_from_a_secret() -> None:
    edge = render("edge")
    config = find(edge, "ConfigMap", "edgefleet-control-plane")["data"]
    assert config["EDGEFLEET_CP_DB_URL"].startswith("sqlite+aiosqlite:////var/lib/edgefleet/")
    deployment = find(edge, "Deployment", "edgefleet-control-plane")
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    mounts = deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "state", "mountPath": "/var/lib/edgefleet/control-plane"} in mounts
    assert find(edge, "PersistentVolumeClaim", "edgefleet-control-plane")
    cluster = render("overlays/cluster")
    assert (
        "EDGEFLEET_CP_DB_URL" not in find(cluster, "ConfigMap", "edgefleet-control-plane")["data"]
    )
    env = find(cluster, "Deployment", "edgefleet-control-plane")["spec"]["template"]["spec"][
        "containers"
    ][0]["env"]
    db = next(e for e in env if e["name"] == "EDGEFLEET_CP_DB_URL")
    assert db["valueFrom"]["secretKeyRef"] == {"name": "edgefleet-postgres", "key": "url"}


def test_only_the_agent_and_the_control_plane_reach_the_broker() -> None:
    docs = render("overlays/cluster")
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    broker = find(docs, "Deployment", "edgefleet-mosquitto")["spec"]["template"]["metadata"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= broker["labels"].items()
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    (expression,) = peer["podSelector"]["matchExpressions"]
    assert expression["key"] == "app.kubernetes.io/component" and expression["operator"] == "In"
    assert set(expression["values"]) == {"agent", "control-plane"}
    assert rule["ports"] == [{"protocol": "TCP", "port": 1883}]
    components = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"][
            "app.kubernetes.io/component"
        ]
        for d in docs
        if d["kind"] in WORKLOADS
    }
    assert components == {
        "edgefleet-agent": "agent",
        "edgefleet-control-plane": "control-plane",
        "edgefleet-mosquitto": "broker",  # not admitted by its own policy: nothing else is
    }


def test_cluster_agents_scale_on_their_queue_depth_not_on_cpu(
    example_repo: Path, tmp_path: Path
) -> None:
    docs = render("overlays/cluster")
    assert not [d for d in docs if d["kind"] == "DaemonSet"]
    hpa = find(docs, "HorizontalPodAutoscaler", "edgefleet-agent")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "edgefleet-agent",
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["target"]["type"] == "AverageValue"
    name = metric["pods"]["metric"]["name"]
    adapter = yaml.safe_load((K3S / "overlays/cluster/prometheus-adapter-values.yaml").read_text())
    (rule,) = adapter["rules"]["custom"]
    assert rule["name"]["as"] == name and rule["seriesQuery"].startswith(f"{name}{{")
    assert find(docs, "Service", "edgefleet-agent")["spec"]["selector"] == {
        "app.kubernetes.io/name": "edgefleet-agent"
    }
    template = find(docs, "Deployment", "edgefleet-agent")["spec"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "8000"
    # the agent does export that metric, under that name, where the annotation says
    path = template["metadata"]["annotations"]["prometheus.io/path"]
    with serve(copy_models(example_repo, tmp_path / "repo", "mlp")) as agent:
        body = httpx.get(f"{agent.url}{path}").text
    assert f"{name}{{" in body


EDGE_OVERLAYS = [o for o in OVERLAYS if o != "overlays/cluster"]


def _required_node_terms(spec: dict[str, Any]) -> list[dict[str, Any]]:
    terms: list[dict[str, Any]] = spec["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    return terms


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_control_plane_and_the_broker_stay_off_edge_nodes(overlay: str) -> None:
    docs = render(overlay)
    for name in ("edgefleet-control-plane", "edgefleet-mosquitto"):
        spec = find(docs, "Deployment", name)["spec"]["template"]["spec"]
        (term,) = _required_node_terms(spec)
        assert term["matchExpressions"] == [
            {"key": "node-role.kubernetes.io/edge", "operator": "DoesNotExist"}
        ], name
        assert "tolerations" not in spec, name  # of the edge taint, or any


@pytest.mark.parametrize("overlay", EDGE_OVERLAYS)
def test_edge_overlays_expose_a_tls_broker_the_nodes_reach(overlay: str) -> None:
    docs = render(overlay)
    service = find(docs, "Service", "edgefleet-mosquitto-edge")["spec"]
    assert service["type"] == "NodePort"  # no EdgeMesh, no cluster DNS needed on the node
    (port,) = service["ports"]
    broker = find(docs, "Deployment", "edgefleet-mosquitto")["spec"]["template"]
    assert service["selector"].items() <= broker["metadata"]["labels"].items()
    (container,) = broker["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port["targetPort"] == "mqtts" and ports["mqtts"] == 8883
    conf = find(docs, "ConfigMap", "edgefleet-mosquitto")["data"]["mosquitto.conf"]
    tls_listener = conf.split("listener 8883\n")[1].split("\nlistener ")[0]
    assert "certfile /mosquitto/tls/tls.crt" in tls_listener
    assert "keyfile /mosquitto/tls/tls.key" in tls_listener
    assert "allow_anonymous false" in tls_listener
    assert "tls_version tlsv1.2" in tls_listener
    volumes = {v["name"]: v for v in broker["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/mosquitto/tls"]]["secret"]["secretName"] == "edgefleet-mosquitto-tls"
    # the policy admits the TLS port from anywhere (node addresses), 1883 from our pods only
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    rules = {r["ports"][0]["port"]: r for r in policy["spec"]["ingress"]}
    assert "from" not in rules[8883] and rules[1883]["from"]
    agent = find(docs, "ConfigMap", "edgefleet-agent")["data"]
    assert agent["EDGEFLEET_AGENT_FLEET__MQTT_URL"].startswith("mqtts://")
    assert agent["EDGEFLEET_AGENT_FLEET__MQTT_URL"].endswith(f":{port['nodePort']}")
    # artifacts and enrolment over HTTPS at the Ingress's host
    ingress = find(docs, "Ingress", "edgefleet-control-plane")["spec"]
    (rule,) = ingress["rules"]
    (tls,) = ingress["tls"]
    assert tls["hosts"] == [rule["host"]] and tls["secretName"] == "edgefleet-control-plane-tls"
    public = find(docs, "ConfigMap", "edgefleet-control-plane")["data"]["EDGEFLEET_CP_PUBLIC_URL"]
    assert public == f"https://{rule['host']}" == agent["EDGEFLEET_AGENT_FLEET__ENROL_URL"]


@pytest.mark.parametrize("overlay", EDGE_OVERLAYS)
def test_edge_agents_enrol_by_claim_with_no_shared_broker_user(overlay: str) -> None:
    docs = render(overlay)
    spec = agent_workload(overlay)["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    config = find(docs, "ConfigMap", "edgefleet-agent")["data"]
    env = {e["name"]: e for e in container["env"]}
    assert "EDGEFLEET_AGENT_FLEET__USERNAME" not in config
    assert "EDGEFLEET_AGENT_FLEET__PASSWORD" not in env
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    token = Path(config["EDGEFLEET_AGENT_FLEET__CLAIM_TOKEN_FILE"])
    claim = volumes[mounts[str(token.parent)]]["secret"]
    assert claim["secretName"] == "edgefleet-claim"
    assert claim["items"] == [{"key": "token", "path": token.name}]
    ca = Path(config["EDGEFLEET_AGENT_FLEET__TLS_CA_FILE"])
    assert volumes[mounts[str(ca.parent)]]["secret"]["secretName"] == "edgefleet-fleet-ca"
    assert env["SSL_CERT_FILE"]["value"] == str(ca)
    # the identity enrolment gives (identity.json in state_dir) stays on the node
    state = next(
        m for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/edgefleet/state"
    )
    assert config["EDGEFLEET_AGENT_FLEET__STATE_DIR"] == state["mountPath"]
    assert volumes[state["name"]]["hostPath"]["path"] == "/var/lib/edgefleet"
    # the broker knows no agent user; the control plane makes each device's in the plugin
    broker = find(docs, "Deployment", "edgefleet-mosquitto")["spec"]["template"]["spec"]
    assert "agent" not in find(docs, "ConfigMap", "edgefleet-mosquitto")["data"]["acl"].split()
    assert "AGENT_PASSWORD" not in broker["initContainers"][0]["command"][2]
    cp = find(docs, "ConfigMap", "edgefleet-control-plane")["data"]
    assert cp["EDGEFLEET_CP_ENROLMENT__ACCOUNTS"] == "dynsec"


@pytest.mark.parametrize("overlay", EDGE_OVERLAYS)
def test_apps_on_the_edge_host_reach_the_agent_on_loopback_and_a_socket(overlay: str) -> None:
    spec = agent_workload(overlay)["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert "hostNetwork" not in spec
    ports = {p["name"]: p for p in container["ports"]}
    for name, number in (("http", 8000), ("grpc", 8001)):
        assert ports[name]["hostPort"] == ports[name]["containerPort"] == number
        assert ports[name]["hostIP"] == "127.0.0.1"  # not the node's other addresses
    config = find(render(overlay), "ConfigMap", "edgefleet-agent")["data"]
    assert config["EDGEFLEET_AGENT_GRPC__PORT"] == "8001"
    uds = Path(config["EDGEFLEET_AGENT_GRPC__UDS"])
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts[str(uds.parent)]]["hostPath"]["path"] == "/run/edgefleet"
    assert spec["securityContext"]["runAsGroup"] == 10001  # the socket's group, in the docs
    shm = "host-shm" in volumes
    assert shm == (overlay == "examples/kubeedge-site")  # opt-in, by components/host-shm
    if shm:
        assert volumes[mounts["/dev/shm"]]["hostPath"]["path"] == "/dev/shm"


def test_the_cluster_overlay_keeps_the_shared_agent_user_for_agents_in_the_cluster() -> None:
    docs = render("overlays/cluster")
    assert "user agent" in find(docs, "ConfigMap", "edgefleet-mosquitto")["data"]["acl"]
    assert not [d for d in docs if d["metadata"]["name"] == "edgefleet-mosquitto-edge"]


def test_the_components_make_the_broker_a_load_balancer_and_issue_certificates(
    tmp_path: Path,
) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(K3S / "overlays/cpu", tmp_path)],
                "components": [
                    os.path.relpath(K3S / "components" / name, tmp_path)
                    for name in ("broker-loadbalancer", "cert-manager")
                ],
            }
        )
    )
    done = subprocess.run(
        [kubectl(), "kustomize", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    docs = tuple(d for d in yaml.safe_load_all(done.stdout) if d)
    service = find(docs, "Service", "edgefleet-mosquitto-edge")
    assert service["spec"]["type"] == "LoadBalancer"
    assert "nodePort" not in service["spec"]["ports"][0]
    kubernetes_validate.validate(service, KUBERNETES_VERSION, strict=True)
    secrets = {
        d["spec"]["secretName"]: d["spec"]["dnsNames"] for d in docs if d["kind"] == "Certificate"
    }
    ingress = find(docs, "Ingress", "edgefleet-control-plane")["spec"]
    assert secrets["edgefleet-control-plane-tls"] == ingress["tls"][0]["hosts"]
    broker = urlsplit(
        find(docs, "ConfigMap", "edgefleet-agent")["data"]["EDGEFLEET_AGENT_FLEET__MQTT_URL"]
    )
    assert secrets["edgefleet-mosquitto-tls"] == [broker.hostname]
