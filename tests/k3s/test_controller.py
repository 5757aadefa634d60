"""ModelRollout objects run as rollouts: the control plane's controller against a fake API
server (the one seam; no API server runs here), with the real rollout engine on SQLite, a real
Mosquitto and real agents of two hardware profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtimes.examples.variants import fragile_mlp_version, mlp_version
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory
from tests.control_plane.test_rollouts import X, infer, push, served, validate, wait_devices
from tests.k3s.conftest import ClusterControlPlane
from tests.k3s.fake_kube import FakeKubeApi


def modelrollout(name: str, version: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "edgefleet.io/v1alpha1",
        "kind": "ModelRollout",
        "metadata": {"name": name, "namespace": "edgefleet"},
        "spec": {
            "model": "mlp",
            "version": version,
            "selector": {"matchLabels": {"site": "lab"}},
            "waves": [1, "100%"],
            "bakeTimeSeconds": 0.5,
            "deviceTimeoutSeconds": 60,
            **spec,
            # no traffic in these tests: waves pass unjudged (by default they wait for it)
            "gates": {"allowUnjudged": True, **spec.get("gates", {})},
        },
    }


def wait_phase(kube: FakeKubeApi, name: str, *phases: str, timeout_s: float = 90) -> dict[str, Any]:
    def status() -> dict[str, Any]:
        return kube.get(name).get("status") or {}

    try:
        wait_until(lambda: status().get("phase") in phases, timeout_s, f"{name} to be {phases}")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; status: {status()}") from None
    return status()


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


@pytest.mark.slow
def test_modelrollout_runs_in_waves_and_reports_progress_fake_k8s_api(
    start_in_cluster: ClusterControlPlane,
    start_agent: AgentFactory,
    kube: FakeKubeApi,
    tmp_path: Path,
) -> None:
    with start_in_cluster() as cp, start_agent("dev-a", cp) as a, start_agent("dev-b", cp) as b:
        wait_devices(cp, "dev-a", "dev-b")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        assert validate(cp.admin, "mlp", 2)["passed"]
        kube.apply(modelrollout("mlp-v2", 2))
        status = wait_phase(kube, "mlp-v2", "Succeeded", "RolledBack", "Failed")
        assert status["phase"] == "Succeeded", status
        assert served(a) == "2" and served(b) == "2"
        assert status["observedGeneration"] == 1
        assert status["counts"]["targeted"] == 2 and status["counts"]["committed"] == 2
        assert [(w["size"], w["devices"], w["states"]) for w in status["waves"]] == [
            ("1", 1, {"committed": 1}),
            ("100%", 1, {"committed": 1}),
        ]
        assert conditions(status) == {
            "Accepted": ("True", "RolloutCreated"),
            "Progressing": ("False", "Succeeded"),
            "Succeeded": ("True", "Succeeded"),
            "RolledBack": ("False", "NotRolledBack"),
            "SpecApplied": ("True", "Applied"),
        }
        assert "rollback" not in status
        # the same rollout through the control plane's API, created by the object
        doc = cp.admin.get(f"/api/v1/rollouts/{status['rolloutId']}").json()
        assert doc["state"] == "succeeded" and doc["created_by"].startswith(
            "modelrollout:edgefleet/mlp-v2@"
        )
        # progress was written while it ran, not only at the end
        phases = [p.get("phase") for name, p in kube.status_patches if name == "mlp-v2"]
        assert phases[0] == "Running" and phases[-1] == "Succeeded"
        # a resync (the object seen again) changes nothing: one rollout, no new status
        patches = len(kube.status_patches)
        kube.apply(kube.get("mlp-v2") | {"metadata": {**kube.get("mlp-v2")["metadata"]}})
        assert len(cp.admin.get("/api/v1/rollouts").json()) == 1
        assert len(kube.status_patches) == patches


@pytest.mark.slow
def test_failed_rollout_shows_its_rollback_in_status_fake_k8s_api(
    start_in_cluster: ClusterControlPlane,
    start_agent: AgentFactory,
    kube: FakeKubeApi,
    tmp_path: Path,
) -> None:
    with start_in_cluster() as cp, start_agent("dev-a", cp) as a, start_agent("dev-b", cp) as b:
        wait_devices(cp, "dev-a", "dev-b")
        push(cp.admin, "mlp", 2, [(fragile_mlp_version(tmp_path / "v2", seed=5), [])])
        assert validate(cp.admin, "mlp", 2)["passed"]
        kube.apply(
            modelrollout(
                "mlp-v2", 2, bakeTimeSeconds=60, gates={"maxErrorRate": 0.05, "minRequests": 10}
            )
        )
        wait_until(lambda: served(a) == "2", what="wave 1 (dev-a) to switch")
        wait_until(
            lambda: (
                (kube.get("mlp-v2").get("status") or {}).get("counts", {}).get("committed") == 1
            ),
            what="the commit of wave 1 in the status",
        )
        assert kube.get("mlp-v2")["status"]["phase"] == "Running"
        poison = X.copy()
        poison[:, 0] = 500.0
        for _ in range(30):
            infer(a, poison)
        status = wait_phase(kube, "mlp-v2", "RolledBack", "Succeeded")
        assert status["phase"] == "RolledBack", status
        rollback = status["rollback"]
        assert rollback["completed"] and "error rate" in rollback["reason"]
        assert rollback["reverted"] == 1 and rollback["failed"] == 0
        assert status["counts"] | {"targeted": 2, "reverted": 1, "skipped": 1} == status["counts"]
        assert status["gateReport"]["wave"] == 0 and status["gateReport"]["errorRate"] > 0.05
        # the report of the last evaluation only: not the note of the earlier ones, which had
        # too few requests to judge
        assert "note" not in status["gateReport"], status["gateReport"]
        assert conditions(status)["RolledBack"] == ("True", "GateFailed")
        assert conditions(status)["Progressing"] == ("False", "RolledBack")
        assert served(a) == "1" and served(b) == "1"
        # RollingBack shows between them when a status write falls inside the rollback (a
        # one-device rollback can finish within one status interval)
        phases = [p.get("phase") for _, p in kube.status_patches if p.get("phase")]
        assert phases[0] == "Running" and phases[-1] == "RolledBack", phases
        assert set(phases) <= {"Running", "RollingBack", "RolledBack"}, phases


@pytest.mark.slow
def test_pause_resume_abort_and_a_refused_rollout_fake_k8s_api(
    start_in_cluster: ClusterControlPlane,
    start_agent: AgentFactory,
    kube: FakeKubeApi,
    tmp_path: Path,
) -> None:
    with start_in_cluster() as cp, start_agent("dev-a", cp) as a, start_agent("dev-b", cp) as b:
        wait_devices(cp, "dev-a", "dev-b")
        # a version that was never validated: refused, and said so on the object
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        kube.apply(modelrollout("too-early", 2))
        status = wait_phase(kube, "too-early", "Failed")
        assert "has not been validated" in status["message"]
        assert conditions(status) == {"Accepted": ("False", "Refused")}
        assert cp.admin.get("/api/v1/rollouts").json() == []
        # paused from the start: wave 1 goes out, wave 2 waits until the spec resumes it
        validate(cp.admin, "mlp", 2)
        obj = kube.apply(modelrollout("mlp-v2", 2, paused=True))
        wait_until(lambda: served(a) == "2", what="wave 1 while paused")
        status = wait_phase(kube, "mlp-v2", "Paused")
        assert conditions(status)["Progressing"] == ("True", "Paused")
        assert served(b) == "1"
        kube.apply(obj | {"spec": {**obj["spec"], "paused": False}})
        assert wait_phase(kube, "mlp-v2", "Succeeded")["observedGeneration"] == 2
        assert served(b) == "2"
        # abort after the first wave of the next version: every touched device goes back
        push(cp.admin, "mlp", 3, [(mlp_version(tmp_path / "v3", seed=3), [])])
        validate(cp.admin, "mlp", 3)
        obj = kube.apply(modelrollout("mlp-v3", 3, bakeTimeSeconds=60))
        wait_until(lambda: served(a) == "3", what="wave 1 of v3")
        kube.apply(obj | {"spec": {**obj["spec"], "abort": True}})
        status = wait_phase(kube, "mlp-v3", "RolledBack")
        assert status["rollback"]["reason"].startswith("aborted by modelrollout:edgefleet/mlp-v3")
        assert conditions(status)["RolledBack"] == ("True", "Aborted")
        assert served(a) == "2" and served(b) == "2"


@pytest.mark.slow
def test_a_restarted_control_plane_adopts_its_rollout_fake_k8s_api(
    start_in_cluster: ClusterControlPlane,
    start_agent: AgentFactory,
    kube: FakeKubeApi,
    tmp_path: Path,
) -> None:
    """The status write can be lost (a crash right after creating the rollout, or the object
    restored from Git without its status): the object finds its rollout again, never a second."""
    with start_in_cluster() as cp, start_agent("dev-a", cp):
        wait_devices(cp, "dev-a")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        validate(cp.admin, "mlp", 2)
        kube.apply(modelrollout("mlp-v2", 2, waves=["100%"]))
        first = wait_phase(kube, "mlp-v2", "Succeeded")["rolloutId"]
    kube.clear_status("mlp-v2")
    assert "status" not in kube.get("mlp-v2")
    with start_in_cluster() as cp:
        status = wait_phase(kube, "mlp-v2", "Succeeded")
        assert status["rolloutId"] == first
        assert [r["id"] for r in cp.admin.get("/api/v1/rollouts").json()] == [first]
    assert kube.closed  # the controller let go of its client on shutdown


@pytest.mark.slow
def test_a_modelrollout_waits_while_another_of_its_model_is_active_fake_k8s_api(
    start_in_cluster: ClusterControlPlane,
    start_agent: AgentFactory,
    kube: FakeKubeApi,
    tmp_path: Path,
) -> None:
    """Not refused for good (Failed is final for its generation): Pending, and started once the
    rollout in its way ended."""
    with start_in_cluster() as cp, start_agent("dev-a", cp) as a:
        wait_devices(cp, "dev-a")
        for version in (2, 3):
            push(
                cp.admin,
                "mlp",
                version,
                [(mlp_version(tmp_path / f"v{version}", seed=version), [])],
            )
            validate(cp.admin, "mlp", version)
        first = kube.apply(modelrollout("mlp-v2", 2, waves=["100%"], bakeTimeSeconds=600))
        wait_until(lambda: served(a) == "2", what="version 2 on dev-a")
        kube.apply(modelrollout("mlp-v3", 3, waves=["100%"]))
        status = wait_phase(kube, "mlp-v3", "Pending")
        assert "is still active on dev-a" in status["message"]
        assert conditions(status) == {"Accepted": ("False", "Waiting")}
        kube.apply(first | {"spec": {**first["spec"], "abort": True}})
        wait_phase(kube, "mlp-v2", "RolledBack")
        assert wait_phase(kube, "mlp-v3", "Succeeded")["rolloutId"] is not None
        assert served(a) == "3"
