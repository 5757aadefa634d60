"""What the ModelRollout controller does with an object changed or replaced under a rollout:
the control plane's controller against a fake API server (the one seam; no API server runs
here), with the real rollout engine on SQLite, a real Mosquitto and real agents."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from runtimes.examples.variants import mlp_version
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory
from tests.control_plane.test_rollouts import push, served, validate, wait_devices
from tests.k3s.conftest import ClusterControlPlane
from tests.k3s.fake_kube import FakeKubeApi
from tests.k3s.test_controller import conditions, modelrollout, wait_phase


def condition(kube: FakeKubeApi, name: str, kind: str) -> dict[str, Any]:
    status = kube.get(name).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


@pytest.mark.slow
def test_a_spec_edit_the_rollout_cannot_take_is_reported_not_observed_fake_k8s_api(
    start_in_cluster: ClusterControlPlane,
    start_agent: AgentFactory,
    kube: FakeKubeApi,
    tmp_path: Path,
) -> None:
    """The CRD lets waves, selector, gates and timings change; the engine cannot change them
    under a running rollout. The edit is not acted on, so observedGeneration stays at the
    generation the rollout runs, and the condition SpecApplied says so."""
    with start_in_cluster() as cp, start_agent("dev-a", cp) as a, start_agent("dev-b", cp) as b:
        wait_devices(cp, "dev-a", "dev-b")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        validate(cp.admin, "mlp", 2)
        obj = kube.apply(modelrollout("mlp-v2", 2, bakeTimeSeconds=3600))
        wait_until(lambda: served(a) == "2", what="wave 1 (dev-a) to switch")
        wait_until(
            lambda: (
                (kube.get("mlp-v2").get("status") or {}).get("counts", {}).get("committed") == 1
            ),
            what="the commit of wave 1 in the status",
        )
        status = kube.get("mlp-v2")["status"]
        assert status["phase"] == "Running" and status["observedGeneration"] == 1
        # shorter bake, tighter gate, in Git; the API server takes it (generation 2)
        edit = {**obj["spec"], "bakeTimeSeconds": 1, "gates": {"maxErrorRate": 0.001}}
        edited = kube.apply(obj | {"spec": edit})
        assert edited["metadata"]["generation"] == 2
        wait_until(
            lambda: (
                condition(kube, "mlp-v2", "SpecApplied").get("status") == "False"
                or kube.get("mlp-v2")["status"]["observedGeneration"] == 2
            ),
            what="the controller to see generation 2",
        )
        status = kube.get("mlp-v2")["status"]
        assert status["observedGeneration"] == 1 and status["phase"] == "Running"
        spec_applied = condition(kube, "mlp-v2", "SpecApplied")
        assert spec_applied["reason"] == "ImmutableWhileRunning"
        assert spec_applied["observedGeneration"] == 2
        assert spec_applied["message"].startswith(
            "spec.bakeTimeSeconds, spec.gates changed after rollout"
        )
        assert "runs the spec of generation 1" in spec_applied["message"]
        # paused is still taken (generation 3), the rest still not
        paused = kube.apply(edited | {"spec": {**edit, "paused": True}})
        status = wait_phase(kube, "mlp-v2", "Paused")
        assert status["observedGeneration"] == 1
        assert conditions(status)["SpecApplied"] == ("False", "ImmutableWhileRunning")
        # the edit undone in Git (generation 4): the spec is the rollout's again
        kube.apply(paused | {"spec": {**obj["spec"], "paused": True}})
        wait_until(
            lambda: kube.get("mlp-v2")["status"].get("observedGeneration") == 4,
            what="observedGeneration 4",
        )
        assert conditions(kube.get("mlp-v2")["status"])["SpecApplied"] == ("True", "Applied")
        assert served(b) == "1"  # wave 2 never started: the hour-long bake still holds it
        # nothing is written that did not change (an absence: waited for as five status
        # intervals of 0.2 s). A late device event may still change a count on a loaded host,
        # so each write is compared with the one before it, not merely counted
        writes = len(kube.status_patches)
        time.sleep(1.0)
        later = kube.status_patches[writes - 1 :]
        assert all(a != b for a, b in zip(later, later[1:], strict=False)), later


@pytest.mark.slow
def test_a_modelrollout_deleted_and_applied_again_reports_its_rollout_fake_k8s_api(
    start_in_cluster: ClusterControlPlane,
    start_agent: AgentFactory,
    kube: FakeKubeApi,
    tmp_path: Path,
) -> None:
    """Restored from Git (a prune and re-sync, ``kubectl replace --force``): a new object, a
    new uid, no status. It reports the rollout its predecessor ran instead of running the
    same version again; another version under the same name is another rollout."""
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
        obj = modelrollout("mlp-v2", 2, waves=["100%"])
        uid = kube.apply(obj)["metadata"]["uid"]
        first = wait_phase(kube, "mlp-v2", "Succeeded")
        kube.delete("mlp-v2")
        again = kube.apply(obj)
        assert again["metadata"]["uid"] != uid and "status" not in again
        status = wait_phase(kube, "mlp-v2", "Succeeded", "Running", "RolledBack", "Failed")
        assert (status["phase"], status["rolloutId"], status["sequence"]) == (
            "Succeeded",
            first["rolloutId"],
            first["sequence"],
        )
        assert [r["id"] for r in cp.admin.get("/api/v1/rollouts").json()] == [first["rolloutId"]]
        # the same name for the next version
        kube.delete("mlp-v2")
        kube.apply(modelrollout("mlp-v2", 3, waves=["100%"]))
        wait_until(
            lambda: (
                (kube.get("mlp-v2").get("status") or {}).get("rolloutId")
                not in (None, first["rolloutId"])
            ),
            what="a rollout of version 3",
        )
        assert wait_phase(kube, "mlp-v2", "Succeeded")["sequence"] > first["sequence"]
        assert served(a) == "3"
        assert len(cp.admin.get("/api/v1/rollouts").json()) == 2
