"""The one seam between the controller and the Kubernetes API server.

Objects cross it as plain JSON dicts (camelCase keys, as the API server sends them); the real
implementation is :class:`control_plane.k8s.client.InClusterKubeApi`, tests use a fake.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

GROUP = "edgefleet.io"
VERSION = "v1alpha1"
PLURAL = "modelrollouts"

Obj = dict[str, Any]


class KubeApiError(Exception):
    """A call to the API server failed: ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class KubeApi(Protocol):
    async def list_rollouts(self, namespace: str) -> tuple[list[Obj], str]:
        """Every ModelRollout of the namespace, and the list's resourceVersion."""
        ...

    def watch_rollouts(
        self, namespace: str, resource_version: str, timeout_s: float
    ) -> AsyncIterator[tuple[str, Obj]]:
        """(ADDED | MODIFIED | DELETED, object) after ``resource_version``, until the server
        ends the watch after ``timeout_s``."""
        ...

    async def patch_rollout_status(self, namespace: str, name: str, status: Obj) -> Obj:
        """Merge-patch ``.status`` through the status subresource; returns the object."""
        ...

    async def read_daemonset(self, namespace: str, name: str) -> Obj: ...

    async def list_controller_revisions(self, namespace: str, selector: str) -> list[Obj]: ...

    async def list_pods(self, namespace: str, selector: str) -> list[Obj]: ...

    async def read_node(self, name: str) -> Obj:
        """A Node (cluster-scoped: the ClusterRole in k3s/base/control-plane/rbac.yaml)."""
        ...

    async def replace_daemonset_template(
        self,
        namespace: str,
        name: str,
        resource_version: str,
        template: Obj,
        annotations: dict[str, str],
    ) -> None:
        """Replace ``spec.template`` and ``metadata.annotations`` if the DaemonSet is still at
        ``resource_version`` (else :class:`KubeApiError` 409 or 422)."""
        ...

    async def close(self) -> None: ...
