"""A real control plane on 127.0.0.1 with the Kubernetes controller attached as in
control_plane/main.py, its API seam given by the test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from control_plane.api.deps import Services
from control_plane.k8s.api import KubeApi
from control_plane.k8s.lifespan import attach
from control_plane.settings import ControlPlaneSettings
from control_plane.settings.kubernetes import KubernetesSettings
from tests.control_plane.server import RunningControlPlane, control_plane


@contextlib.contextmanager
def control_plane_in_cluster(
    state_dir: Path, db_url: str, mqtt_url: str, port: int, kube: KubeApi, **kubernetes: Any
) -> Iterator[RunningControlPlane]:
    k8s = {"enabled": True, "namespace": "edgefleet", "status_interval_s": 0.2}
    k8s |= {"agent_daemonset": None, **kubernetes}  # the guard has its own tests

    def controller(app: FastAPI, services: Services, settings: ControlPlaneSettings) -> None:
        attach(app, services.engine, services.sessions, settings.kubernetes, make_api=lambda: kube)

    with control_plane(
        state_dir,
        db_url,
        mqtt_url,
        port,
        attach=controller,
        kubernetes=KubernetesSettings.model_validate(k8s),
    ) as running:
        yield running
