"""The agent DaemonSet guard against a fake API server (the seam; no API server runs here):
an agent upgrade that fails its health gates goes back to the previous ControllerRevision.
The DaemonSet and its revisions are built from the rendered cpu overlay."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import kubernetes_validate

from control_plane.k8s.daemonset import FAILED, ROLLED_BACK, AgentDaemonSetGuard
from tests.k3s.fake_kube import FakeKubeApi
from tests.k3s.schema import KUBERNETES_VERSION, find, render

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SELECTOR = {"app.kubernetes.io/name": "edgefleet-agent"}
V1, V2 = "7d9f8c6b5", "5c4b3a2f1"


def stamp(ago: timedelta) -> str:
    return (NOW - ago).strftime("%Y-%m-%dT%H:%M:%SZ")


def template(tag: str) -> dict[str, Any]:
    ds = find(render("overlays/cpu"), "DaemonSet", "edgefleet-agent")
    tpl: dict[str, Any] = ds["spec"]["template"]
    tpl["spec"]["containers"][0]["image"] = f"ghcr.io/edgefleet/agent:{tag}"
    return tpl


def revision(hash_: str, number: int, tag: str, ago: timedelta) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": f"edgefleet-agent-{hash_}",
            "namespace": "edgefleet",
            "labels": {**SELECTOR, "controller-revision-hash": hash_},
            "creationTimestamp": stamp(ago),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": "edgefleet-agent",
                    "uid": "ds-uid",
                    "controller": True,
                }
            ],
        },
        "data": {"spec": {"template": {**template(tag), "$patch": "replace"}}},
        "revision": number,
    }


def pod(
    name: str,
    hash_: str,
    *,
    ago: timedelta,
    ready: bool,
    restarts: int = 0,
    waiting: str | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    return {
        "metadata": {
            "name": name,
            "labels": {**SELECTOR, "controller-revision-hash": hash_},
            "creationTimestamp": stamp(ago),
        },
        "spec": {"nodeName": node} if node else {},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "agent", "restartCount": restarts, "state": state}],
        },
    }


def offline_pod() -> dict[str, Any]:
    """Created by the DaemonSet controller for a node that has not come back since."""
    created = pod("edgefleet-agent-a", V2, ago=timedelta(minutes=30), ready=False)
    created["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
    }
    return created


def cluster(
    *pods: dict[str, Any],
    updated: int = 1,
    desired: int = 3,
    v2_age: timedelta = timedelta(minutes=20),
) -> FakeKubeApi:
    """Three edge nodes mid-upgrade from 0.1.0 (revision 1) to 0.2.0 (revision 2)."""
    kube = FakeKubeApi()
    ds = find(render("overlays/cpu"), "DaemonSet", "edgefleet-agent")
    ds["metadata"].update(uid="ds-uid", generation=2, resourceVersion="41", annotations={})
    ds["spec"]["template"] = template("0.2.0-cpu")
    ds["status"] = {
        "observedGeneration": 2,
        "desiredNumberScheduled": desired,
        "currentNumberScheduled": desired,
        "updatedNumberScheduled": updated,
        "numberReady": desired - 1,
        "numberMisscheduled": 0,
    }
    kube.daemonsets["edgefleet-agent"] = ds
    kube.revisions = [
        revision(V1, 1, "0.1.0-cpu", timedelta(days=30)),
        revision(V2, 2, "0.2.0-cpu", v2_age),
    ]
    kube.pods = list(pods)
    return kube


def check(kube: FakeKubeApi) -> str | None:
    guard = AgentDaemonSetGuard(
        kube,
        "edgefleet",
        "edgefleet-agent",
        ready_deadline_s=600,
        max_restarts=3,
        upgrade_window_s=3600,
        interval_s=15,
        clock=lambda: NOW,
    )
    return asyncio.run(guard.check())


def image(kube: FakeKubeApi) -> str:
    ds = kube.daemonsets["edgefleet-agent"]
    return str(ds["spec"]["template"]["spec"]["containers"][0]["image"])


OLD_PODS = [
    pod("edgefleet-agent-b", V1, ago=timedelta(days=30), ready=True),
    pod("edgefleet-agent-c", V1, ago=timedelta(days=30), ready=True),
]


def test_valid_fixtures() -> None:
    """The fake's objects are what an API server would hold."""
    kube = cluster()
    for obj in [kube.daemonsets["edgefleet-agent"], *kube.revisions]:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_upgrade_whose_pod_never_gets_ready_is_rolled_back_fake_k8s_api() -> None:
    kube = cluster(
        pod(
            "edgefleet-agent-a",
            V2,
            ago=timedelta(minutes=15),
            ready=False,
            waiting="ImagePullBackOff",
        ),
        *OLD_PODS,
    )
    verdict = check(kube)
    assert verdict is not None
    assert "edgefleet-agent-a not ready 900 s" in verdict and "ImagePullBackOff" in verdict
    ds = kube.daemonsets["edgefleet-agent"]
    assert image(kube) == "ghcr.io/edgefleet/agent:0.1.0-cpu"
    assert "$patch" not in ds["spec"]["template"]
    assert ds["metadata"]["annotations"][FAILED] == V2
    assert ds["metadata"]["annotations"][ROLLED_BACK].startswith(f"revision 2 ({V2}) -> 1 ({V1})")
    kubernetes_validate.validate(ds, KUBERNETES_VERSION, strict=True)


def test_crash_looping_upgrade_is_rolled_back_fake_k8s_api() -> None:
    kube = cluster(
        pod(
            "edgefleet-agent-a",
            V2,
            ago=timedelta(minutes=3),
            ready=False,
            restarts=5,
            waiting="CrashLoopBackOff",
        ),
        *OLD_PODS,
    )
    assert check(kube) == "pod edgefleet-agent-a restarted 5 times (limit 3)"
    assert image(kube) == "ghcr.io/edgefleet/agent:0.1.0-cpu"


def test_healthy_or_young_upgrades_are_left_alone_fake_k8s_api() -> None:
    cases = {
        "ready": cluster(
            pod("edgefleet-agent-a", V2, ago=timedelta(minutes=15), ready=True), *OLD_PODS
        ),
        "still starting": cluster(
            pod("edgefleet-agent-a", V2, ago=timedelta(minutes=2), ready=False), *OLD_PODS
        ),
        "a few restarts": cluster(
            pod("edgefleet-agent-a", V2, ago=timedelta(minutes=5), ready=True, restarts=3),
            *OLD_PODS,
        ),
        "an old pod failing": cluster(
            pod("edgefleet-agent-a", V2, ago=timedelta(minutes=15), ready=True),
            pod("edgefleet-agent-b", V1, ago=timedelta(days=30), ready=False, restarts=40),
        ),
        "on an offline node": cluster(offline_pod(), *OLD_PODS),
        # done long ago: a pod failing now is the node's problem, not the upgrade's
        "settled": cluster(
            pod("edgefleet-agent-a", V2, ago=timedelta(days=2), ready=False, restarts=9),
            updated=3,
            v2_age=timedelta(days=2),
        ),
    }
    for what, kube in cases.items():
        before = copy.deepcopy(kube.daemonsets["edgefleet-agent"])
        assert check(kube) is None, what
        assert kube.daemonsets["edgefleet-agent"] == before, what


def test_a_change_the_daemonset_controller_has_not_seen_is_not_judged_fake_k8s_api() -> None:
    kube = cluster(pod("edgefleet-agent-a", V2, ago=timedelta(minutes=15), ready=False), *OLD_PODS)
    kube.daemonsets["edgefleet-agent"]["metadata"]["generation"] = 3
    assert check(kube) is None
    assert image(kube) == "ghcr.io/edgefleet/agent:0.2.0-cpu"


def test_a_failed_revision_is_never_rolled_back_to_fake_k8s_api() -> None:
    """After the rollback Kubernetes makes revision 1 current again (as revision 3). If that
    one fails too, the guard does not bounce back to the revision that failed first."""
    kube = cluster(pod("edgefleet-agent-a", V2, ago=timedelta(minutes=15), ready=False), *OLD_PODS)
    assert check(kube) is not None
    v1 = kube.revisions[0]
    v1["revision"] = 3
    v1["metadata"]["creationTimestamp"] = stamp(timedelta(minutes=1))
    ds = kube.daemonsets["edgefleet-agent"]
    ds["status"]["observedGeneration"] = ds["metadata"]["generation"]
    kube.pods = [pod("edgefleet-agent-a", V1, ago=timedelta(minutes=20), ready=False, restarts=7)]
    before = copy.deepcopy(ds)
    assert check(kube) is None
    assert kube.daemonsets["edgefleet-agent"] == before
    assert image(kube) == "ghcr.io/edgefleet/agent:0.1.0-cpu"
