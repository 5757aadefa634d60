"""Rolls the agent DaemonSet back to its previous revision when an agent upgrade fails.

An upgrade is judged while it is under way (some pods still run an older revision) and for
``agent_upgrade_window_s`` after its revision appeared. It fails when a pod of the new revision
restarts more than ``agent_max_restarts`` times, or is still not ready
``agent_ready_deadline_s`` after it was created (crash loops, an image that does not pull,
models that no longer load: the readiness probe is the agent's /v2/health/ready). Pods their
node never reported on (no container statuses: an offline edge node) are not judged.

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

from control_plane.k8s.api import KubeApi, Obj

log = logging.getLogger("edgefleet.control_plane.k8s")

FAILED = "edgefleet.io/failed-revisions"
"""Comma-separated controller-revision-hash values of agent revisions that failed."""
ROLLED_BACK = "edgefleet.io/rolled-back"
"""What the last automatic rollback did, and why."""
HASH = "controller-revision-hash"


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

    async def run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:
                log.exception("checking the agent DaemonSet failed", extra={"ds": self.name})
            await asyncio.sleep(self.interval_s)

    async def check(self) -> str | None:
        """Judge the current upgrade; roll it back if it failed. Returns why it did."""
        ds = await self.api.read_daemonset(self.namespace, self.name)
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
        if current_hash in failed:
            return None
        now = self.clock()
        settled = status.get("updatedNumberScheduled", 0) >= status.get("desiredNumberScheduled", 0)
        age = (now - _time(current["metadata"]["creationTimestamp"])).total_seconds()
        if settled and age > self.upgrade_window_s:
            return None
        pods = await self.api.list_pods(self.namespace, selector)
        verdict = self._verdict(
            [p for p in pods if p["metadata"].get("labels", {}).get(HASH) == current_hash], now
        )
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

    def _verdict(self, pods: list[Obj], now: datetime) -> str | None:
        for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
            name = pod["metadata"]["name"]
            pod_status = pod.get("status") or {}
            containers = pod_status.get("containerStatuses") or []
            if not containers:
                # its node never reported on it: an edge node that is offline (KubeEdge) or
                # still pulling is not the new revision's fault
                continue
            restarts = max((int(c.get("restartCount", 0)) for c in containers), default=0)
            if restarts > self.max_restarts:
                return f"pod {name} restarted {restarts} times (limit {self.max_restarts})"
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in pod_status.get("conditions") or []
            )
            age = (now - _time(pod["metadata"]["creationTimestamp"])).total_seconds()
            if not ready and age > self.ready_deadline_s:
                return (
                    f"pod {name} not ready {age:.0f} s after it was created "
                    f"(deadline {self.ready_deadline_s:.0f} s){_waiting(containers)}"
                )
        return None


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
