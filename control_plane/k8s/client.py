"""The real :class:`~control_plane.k8s.api.KubeApi`: the official ``kubernetes`` client (its
asyncio flavour) with the pod's service account. Imported only when the controller starts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from control_plane.k8s.api import GROUP, PLURAL, VERSION, KubeApiError, Obj

NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


def pod_namespace() -> str:
    """The namespace this pod runs in, from its service account mount."""
    try:
        return NAMESPACE_FILE.read_text().strip()
    except OSError as exc:
        raise RuntimeError(
            "kubernetes.namespace is not set and this does not run in a pod "
            f"({NAMESPACE_FILE} is unreadable)"
        ) from exc


class InClusterKubeApi:
    def __init__(self) -> None:
        try:
            from kubernetes.aio import client, config
        except ImportError as exc:
            raise RuntimeError(
                "kubernetes.enabled needs the kubernetes client: "
                "pip install 'edgefleet[kubernetes]'"
            ) from exc
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException as exc:
            raise RuntimeError(
                f"kubernetes.enabled needs in-cluster credentials (a pod's service account): {exc}"
            ) from exc
        self._exceptions = client.exceptions
        self._client = client.ApiClient()
        self._custom = client.CustomObjectsApi(self._client)
        self._apps = client.AppsV1Api(self._client)
        self._core = client.CoreV1Api(self._client)

    def _dict(self, obj: Any) -> Obj:
        if isinstance(obj, dict):
            return obj
        plain = self._client.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        return dict(plain)

    async def _call(self, call: Any) -> Any:
        try:
            return await call
        except self._exceptions.ApiException as exc:
            raise KubeApiError(int(exc.status or 0), str(exc.reason)) from exc

    async def list_rollouts(self, namespace: str) -> tuple[list[Obj], str]:
        doc = self._dict(
            await self._call(
                self._custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
            )
        )
        return list(doc.get("items", [])), str(doc["metadata"]["resourceVersion"])

    async def watch_rollouts(
        self, namespace: str, resource_version: str, timeout_s: float
    ) -> AsyncIterator[tuple[str, Obj]]:
        from kubernetes.aio import watch

        stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
            self._custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            resource_version=resource_version,
            timeout_seconds=int(timeout_s),
            allow_watch_bookmarks=True,
        )
        async with stream:
            try:
                async for event in stream:
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        yield str(event["type"]), self._dict(event["raw_object"])
            except self._exceptions.ApiException as exc:  # 410 Gone: list again
                raise KubeApiError(int(exc.status or 0), str(exc.reason)) from exc

    async def patch_rollout_status(self, namespace: str, name: str, status: Obj) -> Obj:
        return self._dict(
            await self._call(
                self._custom.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    name,
                    {"status": status},
                    _content_type=MERGE_PATCH,
                )
            )
        )

    async def read_daemonset(self, namespace: str, name: str) -> Obj:
        return self._dict(await self._call(self._apps.read_namespaced_daemon_set(name, namespace)))

    async def list_controller_revisions(self, namespace: str, selector: str) -> list[Obj]:
        doc = self._dict(
            await self._call(
                self._apps.list_namespaced_controller_revision(namespace, label_selector=selector)
            )
        )
        return list(doc.get("items", []))

    async def list_pods(self, namespace: str, selector: str) -> list[Obj]:
        doc = self._dict(
            await self._call(self._core.list_namespaced_pod(namespace, label_selector=selector))
        )
        return list(doc.get("items", []))

    async def read_node(self, name: str) -> Obj:
        return self._dict(await self._call(self._core.read_node(name)))

    async def replace_daemonset_template(
        self,
        namespace: str,
        name: str,
        resource_version: str,
        template: Obj,
        annotations: dict[str, str],
    ) -> None:
        # JSON Patch: "test" makes it conditional on the version judged; "replace" swaps the
        # whole template, as a merge patch could not (it would keep fields the old one lacks)
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
            {"op": "replace", "path": "/spec/template", "value": template},
            {"op": "add", "path": "/metadata/annotations", "value": annotations},
        ]
        await self._call(
            self._apps.patch_namespaced_daemon_set(name, namespace, patch, _content_type=JSON_PATCH)
        )

    async def close(self) -> None:
        await self._client.close()  # type: ignore[no-untyped-call]
