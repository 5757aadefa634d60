"""An in-memory stand-in for the Kubernetes API server at the controller's seam
(control_plane.k8s.api.KubeApi): no API server can run here. It does what the server does for
the calls the controller makes: resourceVersions, generations bumped by spec changes only,
the status subresource (a JSON merge patch, validated against the CRD's schema), watches
that end after their timeout, and conditional DaemonSet template replacement.

The test thread changes objects while the controller reads them on the control plane's loop:
a lock guards the state and watchers are woken with call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

from control_plane.k8s.api import KubeApiError, Obj
from tests.k3s.schema import modelrollout_validator


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class FakeKubeApi:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = 0
        self._events: list[tuple[int, str, Obj]] = []
        self._watchers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._validator = modelrollout_validator()
        self.rollouts: dict[str, Obj] = {}
        self.daemonsets: dict[str, Obj] = {}
        self.revisions: list[Obj] = []
        self.pods: list[Obj] = []
        self.nodes: dict[str, Obj] = {}
        self.may_read_nodes = True
        """False: the service account may not get nodes (403), as without the ClusterRole."""
        self.status_patches: list[tuple[str, Obj]] = []
        self.closed = False

    # -- what the test does (as kubectl would) ------------------------------------------------

    def apply(self, obj: Obj) -> Obj:
        """Create or update a ModelRollout's metadata and spec (never its status)."""
        with self._lock:
            name = obj["metadata"]["name"]
            old = self.rollouts.get(name)
            new = copy.deepcopy(obj)
            meta = new["metadata"]
            if old is None:
                meta.update(uid=str(uuid.uuid4()), generation=1)
                new.pop("status", None)
            else:
                meta.update(uid=old["metadata"]["uid"], generation=old["metadata"]["generation"])
                if new.get("spec") != old.get("spec"):
                    meta["generation"] += 1
                if "status" in old:
                    new["status"] = old["status"]
            meta.setdefault("namespace", "edgefleet")
            self._validator.validate(new)  # the API server checks the CRD's schema
            self._store(new, "ADDED" if old is None else "MODIFIED")
            return copy.deepcopy(new)

    def delete(self, name: str) -> None:
        with self._lock:
            obj = self.rollouts.pop(name)
            self._record("DELETED", obj)

    def clear_status(self, name: str) -> None:
        with self._lock:
            obj = copy.deepcopy(self.rollouts[name])
            obj.pop("status", None)
            self._store(obj, "MODIFIED")

    def get(self, name: str) -> Obj:
        with self._lock:
            return copy.deepcopy(self.rollouts[name])

    def _store(self, obj: Obj, kind: str) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        self.rollouts[obj["metadata"]["name"]] = obj
        self._record(kind, obj)

    def _record(self, kind: str, obj: Obj) -> None:
        self._events.append((self._version, kind, copy.deepcopy(obj)))
        for loop, wake in self._watchers:
            loop.call_soon_threadsafe(wake.set)

    # -- KubeApi ---------------------------------------------------------------------------

    async def list_rollouts(self, namespace: str) -> tuple[list[Obj], str]:
        with self._lock:
            items = [
                copy.deepcopy(o)
                for o in self.rollouts.values()
                if o["metadata"]["namespace"] == namespace
            ]
            return items, str(self._version)

    async def watch_rollouts(
        self, namespace: str, resource_version: str, timeout_s: float
    ) -> AsyncIterator[tuple[str, Obj]]:
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        deadline = loop.time() + timeout_s
        seen = int(resource_version)
        with self._lock:
            self._watchers.append((loop, wake))
        try:
            while True:
                with self._lock:
                    pending = [e for e in self._events if e[0] > seen]
                for version, kind, obj in pending:
                    seen = version
                    if obj["metadata"]["namespace"] == namespace:
                        yield kind, copy.deepcopy(obj)
                if pending:
                    continue
                try:
                    await asyncio.wait_for(wake.wait(), max(deadline - loop.time(), 0))
                except TimeoutError:
                    return  # the server ends the watch
                wake.clear()
        finally:
            with self._lock:
                self._watchers.remove((loop, wake))

    async def patch_rollout_status(self, namespace: str, name: str, status: Obj) -> Obj:
        with self._lock:
            if name not in self.rollouts:
                raise KubeApiError(404, f"modelrollouts.edgefleet.io {name!r} not found")
            obj = copy.deepcopy(self.rollouts[name])
            obj["status"] = merge_patch(obj.get("status"), status)
            if not obj["status"]:
                obj.pop("status")
            self._validator.validate(obj)  # the status subresource is validated too
            self.status_patches.append((name, copy.deepcopy(status)))
            self._store(obj, "MODIFIED")
            return copy.deepcopy(obj)

    async def read_daemonset(self, namespace: str, name: str) -> Obj:
        with self._lock:
            if name not in self.daemonsets:
                raise KubeApiError(404, f"daemonsets.apps {name!r} not found")
            return copy.deepcopy(self.daemonsets[name])

    async def list_controller_revisions(self, namespace: str, selector: str) -> list[Obj]:
        with self._lock:
            return [copy.deepcopy(r) for r in self.revisions if _matches(r, selector)]

    async def list_pods(self, namespace: str, selector: str) -> list[Obj]:
        with self._lock:
            return [copy.deepcopy(p) for p in self.pods if _matches(p, selector)]

    async def read_node(self, name: str) -> Obj:
        with self._lock:
            if not self.may_read_nodes:
                raise KubeApiError(403, f"nodes {name!r} is forbidden")
            if name not in self.nodes:
                raise KubeApiError(404, f"nodes {name!r} not found")
            return copy.deepcopy(self.nodes[name])

    async def replace_daemonset_template(
        self,
        namespace: str,
        name: str,
        resource_version: str,
        template: Obj,
        annotations: dict[str, str],
    ) -> None:
        with self._lock:
            ds = self.daemonsets[name]
            if ds["metadata"]["resourceVersion"] != resource_version:
                raise KubeApiError(422, "the test operation on /metadata/resourceVersion failed")
            ds["spec"]["template"] = copy.deepcopy(template)
            ds["metadata"]["annotations"] = dict(annotations)
            ds["metadata"]["generation"] += 1
            self._version += 1
            ds["metadata"]["resourceVersion"] = str(self._version)

    async def close(self) -> None:
        self.closed = True


def _matches(obj: Obj, selector: str) -> bool:
    labels = obj["metadata"].get("labels") or {}
    pairs = (term.split("=", 1) for term in selector.split(",") if term)
    return all(labels.get(k) == v for k, v in pairs)
