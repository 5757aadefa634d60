"""The replicas overlay: two control plane pods on PostgreSQL, each its own broker client in
one shared subscription group, replaced one at a time, sharing their keys and artifacts."""

from __future__ import annotations

import pytest

from control_plane.settings import ControlPlaneSettings
from tests.k3s.schema import find, render

OVERLAY = "overlays/replicas"


def test_two_replicas_each_with_its_own_client_id_in_one_shared_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    docs = render(OVERLAY)
    deployment = find(docs, "Deployment", "edgefleet-control-plane")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    # one at a time, never below one: the other pod ingests (and leads) meanwhile
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    (container,) = spec["template"]["spec"]["containers"]
    env = {var["name"]: var for var in container["env"]}
    assert env["EDGEFLEET_CP_MQTT_CLIENT_ID"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }
    assert env["EDGEFLEET_CP_DB_URL"]["valueFrom"]["secretKeyRef"]["name"] == "edgefleet-postgres"
    data = find(docs, "ConfigMap", "edgefleet-control-plane")["data"]
    assert "EDGEFLEET_CP_MQTT_CLIENT_ID" not in data  # one id for two pods would be a fight
    assert "EDGEFLEET_CP_DB_URL" not in data  # not SQLite: one writer only
    for name, value in data.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("EDGEFLEET_CP_DB_URL", "postgresql+psycopg://edgefleet@postgres/edgefleet")
    settings = ControlPlaneSettings()
    assert settings.mqtt_shared_group == "control-planes"
    # a dead leader's loops move within the lease and one renewal: the 10 s the issue asks
    assert settings.leader_lease_ttl_s + settings.leader_renew_interval_s <= 10


def test_the_replicas_share_their_volume_and_keep_one_up_through_a_drain() -> None:
    docs = render(OVERLAY)
    claim = find(docs, "PersistentVolumeClaim", "edgefleet-control-plane")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # keys and artifacts, shared
    budget = find(docs, "PodDisruptionBudget", "edgefleet-control-plane")
    pods = find(docs, "Deployment", "edgefleet-control-plane")["spec"]["template"]["metadata"]
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= pods["labels"].items()
    assert budget["metadata"]["namespace"] == "edgefleet"
    # the console's login sessions are a replica's own: a browser sticks to one
    service = find(docs, "Service", "edgefleet-control-plane")
    assert service["spec"]["sessionAffinity"] == "ClientIP"
