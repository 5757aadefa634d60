"""What the agent DaemonSet guard must not blame on an agent upgrade, against the fake API
server (the seam; no API server runs here): pods whose node went away (offline, rebooting,
deleted), the old pods of a revision made current again, and a namespace without the
DaemonSet (the cluster overlay runs the agent as a Deployment)."""

from __future__ import annotations

import asyncio
import copy
import logging
from datetime import timedelta
from typing import Any

import kubernetes_validate
import pytest

from control_plane.k8s.daemonset import FAILED, AgentDaemonSetGuard
from tests.k3s.fake_kube import FakeKubeApi
from tests.k3s.schema import KUBERNETES_VERSION
from tests.k3s.test_agent_guard import (
    NOW,
    V1,
    V2,
    check,
    cluster,
    image,
    pod,
    revision,
    stamp,
    template,
)

V0 = "0a0a0a0a0"
RESTORED = "edgefleet.io/restored-revision"  # documented in docs/kubernetes.md
LOGGER = "edgefleet.control_plane.k8s"
MINUTE = timedelta(minutes=1)


def node(name: str, *, ready: bool, taint: str | None = None) -> dict[str, Any]:
    """A Node; one whose kubelet stopped reporting is Ready Unknown and tainted unreachable
    by the node lifecycle controller."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"node-role.kubernetes.io/edge": ""}},
        "spec": {"taints": [{"key": taint, "effect": "NoExecute"}]} if taint else {},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "Unknown",
                    "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                    "lastTransitionTime": stamp(15 * MINUTE),
                }
            ]
        },
    }


def unready(
    node_name: str | None,
    *,
    since: timedelta,
    containers_ready: bool,
    started: timedelta | None = None,
    restarts: int = 0,
    reason: str | None = None,
) -> dict[str, Any]:
    """Upgraded 20 minutes ago on ``node_name``; not ready since ``since`` ago."""
    p = pod("edgefleet-agent-a", V2, ago=20 * MINUTE, ready=False, node=node_name)
    p["status"]["conditions"] = [
        {"type": "Ready", "status": "False", "lastTransitionTime": stamp(since)}
        | ({"reason": reason} if reason else {}),
        {"type": "ContainersReady", "status": "True" if containers_ready else "False"},
    ]
    (container,) = p["status"]["containerStatuses"]
    container["restartCount"] = restarts
    container["state"] = {"running": {"startedAt": stamp(started or 20 * MINUTE)}}
    return p


def upgraded(*pods: dict[str, Any], **nodes: dict[str, Any]) -> FakeKubeApi:
    """Every node runs 0.2.0 since 20 minutes (still inside the upgrade window); b and c are
    healthy on Ready nodes."""
    kube = cluster(
        *pods,
        pod("edgefleet-agent-b", V2, ago=19 * MINUTE, ready=True, node="node-b"),
        pod("edgefleet-agent-c", V2, ago=18 * MINUTE, ready=True, node="node-c"),
        updated=3,
        desired=3,
    )
    kube.nodes = {
        "node-b": node("node-b", ready=True),
        "node-c": node("node-c", ready=True),
        **nodes,
    }
    return kube


UNREACHABLE = node("node-a", ready=False, taint="node.kubernetes.io/unreachable")


def test_node_fixtures_are_valid() -> None:
    for obj in [UNREACHABLE, node("node-b", ready=True)]:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_a_node_that_went_away_does_not_fail_a_healthy_upgrade_fake_k8s_api() -> None:
    """docs/kubernetes.md: an offline node does not roll an agent upgrade back. The node keeps
    its pod's last report (container running, no restarts); only its Ready turns False."""
    cases = {
        "offline after it was ready": upgraded(
            unready("node-a", since=12 * MINUTE, containers_ready=True), **{"node-a": UNREACHABLE}
        ),
        "offline while it was still starting": upgraded(
            unready("node-a", since=20 * MINUTE, containers_ready=False),
            **{"node-a": UNREACHABLE},
        ),
        "not ready, tainted not-ready": upgraded(
            unready("node-a", since=12 * MINUTE, containers_ready=False),
            **{"node-a": node("node-a", ready=False, taint="node.kubernetes.io/not-ready")},
        ),
        "marked NodeNotReady": upgraded(
            unready(None, since=12 * MINUTE, containers_ready=False, reason="NodeNotReady")
        ),
        "its node deleted": upgraded(
            unready("node-gone", since=12 * MINUTE, containers_ready=False)
        ),
        # back from a 15-minute outage: the kubelet restarted the agent, which loads its models
        "rebooted, starting again": upgraded(
            unready(
                "node-a", since=15 * MINUTE, containers_ready=False, started=MINUTE, restarts=1
            ),
            **{"node-a": node("node-a", ready=True)},
        ),
    }
    for what, kube in cases.items():
        before = copy.deepcopy(kube.daemonsets["edgefleet-agent"])
        assert check(kube) is None, what
        assert kube.daemonsets["edgefleet-agent"] == before, what
        assert image(kube) == "ghcr.io/edgefleet/agent:0.2.0-cpu", what


def test_a_pod_that_never_gets_ready_on_a_ready_node_still_fails_the_upgrade_fake_k8s_api(
    caplog: pytest.LogCaptureFixture,
) -> None:
    never_ready = unready("node-a", since=20 * MINUTE, containers_ready=False)
    kube = upgraded(never_ready, **{"node-a": node("node-a", ready=True)})
    verdict = check(kube)
    assert verdict is not None and "edgefleet-agent-a not ready 1200 s after it was created" in (
        verdict
    )
    assert image(kube) == "ghcr.io/edgefleet/agent:0.1.0-cpu"
    # without the ClusterRole that lets it read nodes, the guard judges by the pod alone, and
    # says why it cannot tell an offline node
    kube = upgraded(never_ready, **{"node-a": UNREACHABLE})
    kube.may_read_nodes = False
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert check(kube) is not None
    (warning,) = [r for r in caplog.records if r.name == LOGGER and "nodes" in r.getMessage()]
    assert "cannot read nodes" in warning.getMessage() and "forbidden" in warning.getMessage()


def test_the_revision_the_guard_rolled_back_to_is_not_judged_again_fake_k8s_api() -> None:
    """After the rollback the DaemonSet controller makes 0.1.0's ControllerRevision current
    again under a new number. Its pods that were never replaced are a month old, with the
    restarts of a month: judging them would roll 0.1.0 back to 0.0.9, then further."""
    kube = cluster(
        pod("edgefleet-agent-a", V2, ago=15 * MINUTE, ready=False, waiting="ImagePullBackOff"),
        pod("edgefleet-agent-b", V1, ago=timedelta(days=30), ready=True, restarts=4),
        pod("edgefleet-agent-c", V1, ago=timedelta(days=30), ready=True),
    )
    kube.revisions = [
        revision(V0, 1, "0.0.9-cpu", timedelta(days=90)),
        revision(V1, 2, "0.1.0-cpu", timedelta(days=30)),
        revision(V2, 3, "0.2.0-cpu", 20 * MINUTE),
    ]
    assert check(kube) is not None
    ds = kube.daemonsets["edgefleet-agent"]
    assert ds["metadata"]["annotations"][FAILED] == V2
    assert ds["metadata"]["annotations"][RESTORED] == V1
    # what the DaemonSet controller does next
    kube.revisions[1]["revision"] = 4
    ds["status"] |= {
        "observedGeneration": ds["metadata"]["generation"],
        "updatedNumberScheduled": 2,
    }
    kube.pods[0] = pod("edgefleet-agent-a", V1, ago=MINUTE, ready=False)
    before = copy.deepcopy(ds)
    assert check(kube) is None
    assert kube.daemonsets["edgefleet-agent"] == before
    assert image(kube) == "ghcr.io/edgefleet/agent:0.1.0-cpu"


def test_a_revision_made_current_again_is_judged_by_its_new_pods_only_fake_k8s_api() -> None:
    """``kubectl rollout undo`` by hand: 0.1.0's revision is current again (as revision 3);
    its creationTimestamp is a month old, its untouched pods too."""

    def undone(*pods: dict[str, Any]) -> FakeKubeApi:
        kube = cluster(
            *pods,
            pod("edgefleet-agent-b", V1, ago=timedelta(days=30), ready=True, restarts=4),
            pod("edgefleet-agent-c", V1, ago=timedelta(days=30), ready=True),
            updated=2,
        )
        kube.revisions = [
            revision(V0, 1, "0.0.9-cpu", timedelta(days=90)),
            revision(V2, 2, "0.2.0-cpu", 20 * MINUTE),
            revision(V1, 3, "0.1.0-cpu", timedelta(days=30)),
        ]
        kube.daemonsets["edgefleet-agent"]["spec"]["template"] = template("0.1.0-cpu")
        return kube

    kube = undone()
    assert check(kube) is None
    assert image(kube) == "ghcr.io/edgefleet/agent:0.1.0-cpu"
    # a pod the undo created is judged: it crash-loops
    kube = undone(pod("edgefleet-agent-a", V1, ago=5 * MINUTE, ready=False, restarts=5))
    assert check(kube) == "pod edgefleet-agent-a restarted 5 times (limit 3)"


def test_no_daemonset_to_guard_is_one_warning_not_an_error_every_check_fake_k8s_api(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """overlays/cluster deploys the agent as a Deployment (and turns the guard off); with the
    guard on anyway, the missing DaemonSet is said once, until that changes."""
    kube = FakeKubeApi()
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

    async def checks(times: int) -> list[str | None]:
        return [await guard.check() for _ in range(times)]

    missing = (
        "WARNING no DaemonSet edgefleet/edgefleet-agent to guard "
        '(kubernetes.agent_daemonset "" turns the guard off)'
    )

    def said() -> list[str]:
        return [
            f"{r.levelname} {r.getMessage()}"
            for r in caplog.records
            if r.name == LOGGER and r.levelno >= logging.WARNING
        ]

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert asyncio.run(checks(3)) == [None, None, None]
        assert said() == [missing]
        kube.daemonsets["edgefleet-agent"] = cluster().daemonsets["edgefleet-agent"]
        assert asyncio.run(checks(1)) == [None]
        del kube.daemonsets["edgefleet-agent"]
        assert asyncio.run(checks(2)) == [None, None]
    assert said() == [missing, missing]
