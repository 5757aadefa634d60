"""Rolls the agent DaemonSet back to its previous revision when an agent upgrade fails.

An upgrade is judged while it is under way (some pods still run an older revision) and for
``agent_upgrade_window_s`` after its revision became current. It fails when a pod of the new
revision restarts more than ``agent_max_restarts`` times, or is still not ready
``agent_ready_deadline_s`` after it was created, last (re)started or last turned unready (crash
loops, an image that does not pull, models that no longer load: the readiness probe is the
agent's /v2/health/ready). Not judged, because their failures are not the revision's:

- pods whose node is away: never reported on them (no container statuses), or is not Ready
  (an offline KubeEdge node, a node rebooting), or was deleted;
- pods of the revision older than its turn as the current one: ``kubectl rollout undo`` (and the
  guard's own rollback) makes an old ControllerRevision current again under a new number, and
  its untouched pods carry a lifetime of restarts;
- the revision the guard itself last rolled back to: it ran before the failed upgrade, and
  judging it would walk the DaemonSet back through its history.

The rollback is what ``kubectl rollout undo`` does: the DaemonSet's pod template becomes the
previous ControllerRevision's. The failed revision's hash is recorded in an annotation so it
is never chosen again, nor judged again once it is the rollback target's successor.
NOTE: https://kubernetes.io/docs/tasks/manage-daemon/rollback-daemon-set/
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from control_plane.k8s.api import KubeApi, KubeApiError, Obj

log = logging.getLogger("edgefleet.control_plane.k8s")

FAILED = "edgefleet.io/failed-revisions"
"""Comma-separated controller-revision-hash values of agent revisions that failed."""
ROLLED_BACK = "edgefleet.io/rolled-back"
"""What the last automatic rollback did, and why."""
RESTORED = "edgefleet.io/restored-revision"
"""controller-revision-hash of the revision the last automatic rollback went back to."""
HASH = "controller-revision-hash"
NODE_DOWN_TAINTS = frozenset({"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"})
"""Taints the node lifecycle controller sets on a node that stopped reporting or is not ready."""


class AgentDaemonSetGuard:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        *,
        ready_deadline_s: float,
        max_restarts: int,
        upgrade_window_s: float,
        interval_s: float,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.ready_deadline_s = ready_deadline_s
        self.max_restarts = max_restarts
        self.upgrade_window_s = upgrade_window_s
        self.interval_s = interval_s
        self.clock = clock  # the API server's timestamps are wall-clock: so is this
        self._warned: dict[str, str] = {}
        """The last warning per topic about the guard's setup (each logged once until it
        changes)."""

    async def run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:
                log.exception("checking the agent DaemonSet failed", extra={"ds": self.name})
            await asyncio.sleep(self.interval_s)

    async def check(self) -> str | None:
        """Judge the current upgrade; roll it back if it failed. Returns why it did."""
        try:
            ds = await self.api.read_daemonset(self.namespace, self.name)
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            # overlays/cluster runs the agent as a Deployment: nothing to guard, and nothing
            # that gets better by logging it every interval
            self._warn(
                "daemonset",
                f"no DaemonSet {self.namespace}/{self.name} to guard "
                '(kubernetes.agent_daemonset "" turns the guard off)',
            )
            return None
        self._warned.pop("daemonset", None)
        meta, spec, status = ds["metadata"], ds["spec"], ds.get("status") or {}
        if status.get("observedGeneration", 0) < meta.get("generation", 0):
            return None  # the DaemonSet controller has not acted on the last change yet
        labels = spec["selector"].get("matchLabels") or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        revisions = sorted(
            (
                r
                for r in await self.api.list_controller_revisions(self.namespace, selector)
                if any(
                    o.get("uid") == meta["uid"] for o in r["metadata"].get("ownerReferences", [])
                )
            ),
            key=lambda r: int(r["revision"]),
        )
        if len(revisions) < 2:
            return None
        current = revisions[-1]
        current_hash = current["metadata"]["labels"][HASH]
        annotations = dict(meta.get("annotations") or {})
        failed = [h for h in annotations.get(FAILED, "").split(",") if h]
        if current_hash in failed or current_hash == annotations.get(RESTORED):
            return None
        now = self.clock()
        # A revision made current again keeps its creationTimestamp, but it became current
        # after every other revision was created: its turn began no earlier than the newest.
        since = max(_time(r["metadata"]["creationTimestamp"]) for r in revisions)
        settled = status.get("updatedNumberScheduled", 0) >= status.get("desiredNumberScheduled", 0)
        if settled and (now - since).total_seconds() > self.upgrade_window_s:
            return None
        pods = [
            p
            for p in await self.api.list_pods(self.namespace, selector)
            if p["metadata"].get("labels", {}).get(HASH) == current_hash
            and _time(p["metadata"]["creationTimestamp"]) >= since
        ]
        verdict = await self._verdict(pods, now)
        if verdict is None:
            return None
        previous = next(
            (r for r in reversed(revisions[:-1]) if r["metadata"]["labels"][HASH] not in failed),
            None,
        )
        if previous is None:
            log.error(
                "agent upgrade failed and there is nothing to roll back to",
                extra={"reason": verdict},
            )
            return None
        template = _template(previous)
        previous_hash = previous["metadata"]["labels"][HASH]
        annotations[FAILED] = ",".join([*failed, current_hash][-10:])
        annotations[RESTORED] = previous_hash
        annotations[ROLLED_BACK] = (
            f"revision {current['revision']} ({current_hash}) -> {previous['revision']} "
            f"({previous_hash}): {verdict}"
        )
        await self.api.replace_daemonset_template(
            self.namespace, self.name, meta["resourceVersion"], template, annotations
        )
        log.warning(
            "agent upgrade failed its health gates: DaemonSet rolled back",
            extra={"ds": self.name, "from": current_hash, "to": previous_hash, "reason": verdict},
        )
        return verdict

    async def _verdict(self, pods: list[Obj], now: datetime) -> str | None:
        nodes: dict[str, bool] = {}
        for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
            fault = self._fault(pod, now)
            if fault is None or _marked_not_ready(pod):
                continue
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                if node not in nodes:
                    nodes[node] = await self._node_ready(node)
                if not nodes[node]:
                    continue  # the node is away: its pod's state says nothing of the revision
            return fault
        return None

    def _fault(self, pod: Obj, now: datetime) -> str | None:
        """Why this pod fails the upgrade, judged by what its node last reported."""
        name = pod["metadata"]["name"]
        pod_status = pod.get("status") or {}
        containers = pod_status.get("containerStatuses") or []
        if not containers:
            # its node never reported on it: an edge node that is offline (KubeEdge) or
            # still pulling is not the new revision's fault
            return None
        restarts = max((int(c.get("restartCount", 0)) for c in containers), default=0)
        if restarts > self.max_restarts:
            return f"pod {name} restarted {restarts} times (limit {self.max_restarts})"
        ready = _condition(pod, "Ready")
        if ready.get("status") == "True":
            return None
        # the deadline runs from the latest of: creation, the last turn to unready, the last
        # container start (a node that rebooted restarts its pods, which then load models)
        since = max(
            [
                _time(pod["metadata"]["creationTimestamp"]),
                *([_time(ready["lastTransitionTime"])] if ready.get("lastTransitionTime") else []),
                *(
                    _time(c["state"]["running"]["startedAt"])
                    for c in containers
                    if ((c.get("state") or {}).get("running") or {}).get("startedAt")
                ),
            ]
        )
        unready_s = (now - since).total_seconds()
        if unready_s <= self.ready_deadline_s:
            return None
        created = since == _time(pod["metadata"]["creationTimestamp"])
        return (
            f"pod {name} not ready {unready_s:.0f} s after it "
            f"{'was created' if created else 'last started or turned unready'} "
            f"(deadline {self.ready_deadline_s:.0f} s){_waiting(containers)}"
        )

    async def _node_ready(self, name: str) -> bool:
        try:
            node = await self.api.read_node(name)
        except KubeApiError as exc:
            if exc.status == 404:
                return False  # deleted: its pods go with it
            if exc.status != 403:
                raise
            # a Role without `get nodes` (rbac.yaml grants it): judge by the pod alone
            self._warn("nodes", f"cannot read nodes to tell offline ones: {exc.message}")
            return True
        self._warned.pop("nodes", None)
        taints = {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (node.get("status") or {}).get("conditions") or []
        )
        return ready and not taints & NODE_DOWN_TAINTS

    def _warn(self, topic: str, warning: str) -> None:
        if self._warned.get(topic) != warning:
            log.warning(warning, extra={"ds": self.name})
            self._warned[topic] = warning


def _condition(pod: Obj, kind: str) -> Obj:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), {})


def _marked_not_ready(pod: Obj) -> bool:
    """Whether the node lifecycle controller, not the kubelet, turned the pod unready: it flips
    the Ready condition of a node's pods when the node stops reporting, and nothing else (the
    kubelet turns ContainersReady off with it, or says ReadinessGatesNotReady).
    NOTE: MarkPodsNotReady in kubernetes/pkg/controller/util/node/controller_utils.go
    """
    ready = _condition(pod, "Ready")
    if ready.get("status") == "True":
        return False
    if ready.get("reason") == "NodeNotReady" or (pod.get("status") or {}).get("reason") == (
        "NodeLost"
    ):
        return True
    return (
        _condition(pod, "ContainersReady").get("status") == "True"
        and ready.get("reason") != "ReadinessGatesNotReady"
    )


def _waiting(containers: list[Obj]) -> str:
    reasons = [
        str(c["state"]["waiting"].get("reason"))
        for c in containers
        if (c.get("state") or {}).get("waiting")
    ]
    return f": {', '.join(reasons)}" if reasons else ""


def _template(revision: Obj) -> dict[str, Any]:
    """The pod template a DaemonSet ControllerRevision holds (``data`` is the patch that
    restores it, with a ``$patch: replace`` directive)."""
    template = dict(revision["data"]["spec"]["template"])
    template.pop("$patch", None)
    return template


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
