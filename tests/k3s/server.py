"""A real control plane on 127.0.0.1 with the Kubernetes controller attached as in
control_plane/main.py, its API seam given by the test."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from control_plane.api.app import create_app
from control_plane.k8s.api import KubeApi
from control_plane.k8s.lifespan import attach
from control_plane.k8s.settings import KubernetesSettings
from control_plane.main import build
from control_plane.settings import ControlPlaneSettings
from tests.agent.server import wait_until
from tests.control_plane.server import RunningControlPlane


@contextlib.contextmanager
def control_plane_in_cluster(
    state_dir: Path, db_url: str, mqtt_url: str, port: int, kube: KubeApi, **kubernetes: Any
) -> Iterator[RunningControlPlane]:
    k8s = {"enabled": True, "namespace": "edgefleet", "status_interval_s": 0.2}
    k8s |= {"agent_daemonset": None, **kubernetes}  # the guard has its own tests
    settings = ControlPlaneSettings(
        db_url=db_url,
        mqtt_url=mqtt_url,
        host="127.0.0.1",
        port=port,
        state_dir=state_dir,
        artifact_dir=state_dir / "artifacts",
        rollout_tick_s=0.2,
        ingest_max_delay_s=0.05,
        ingest_telemetry_delay_s=0.05,
        kubernetes=KubernetesSettings.model_validate(k8s),
    )
    services, trust = build(settings)
    app = create_app(services, trust)
    attach(app, services, settings.kubernetes, make_api=lambda: kube)
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_config=None, access_log=False, loop="asyncio"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: server.started, what="the control plane")
        wait_until(lambda: services.bus.connected.is_set(), what="the broker connection")
        token = (state_dir / "admin-token").read_text().strip()
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120
        ) as admin:
            yield RunningControlPlane(url, services, admin, state_dir)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
