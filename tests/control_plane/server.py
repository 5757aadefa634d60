"""A real control plane on 127.0.0.1 (uvicorn in a thread), on SQLite or PostgreSQL."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from control_plane.api.deps import Services
from control_plane.app import create_app
from control_plane.main import build
from control_plane.settings import ControlPlaneSettings
from tests.agent.server import wait_until


@dataclass
class RunningControlPlane:
    url: str
    services: Services
    admin: httpx.Client
    state_dir: Path

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=120
        )

    def token(self, role: str, name: str | None = None) -> str:
        resp = self.admin.post(
            "/api/v1/tokens", json={"name": name or f"{role}-user", "role": role}
        )
        assert resp.status_code == 201, resp.text
        return str(resp.json()["token"])

    @property
    def trust_root_file(self) -> Path:
        return self.state_dir / "trust-root.json"


Attach = Callable[[FastAPI, Services, ControlPlaneSettings], None]
"""What a caller adds to the app before it serves, as control_plane/main.py would (the
Kubernetes controller with its API seam, in tests/k3s)."""


@contextlib.contextmanager
def control_plane(
    state_dir: Path,
    db_url: str,
    mqtt_url: str,
    port: int,
    attach: Attach | None = None,
    **overrides: Any,
) -> Iterator[RunningControlPlane]:
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
        **overrides,
    )
    services, trust = build(settings)
    app = create_app(services, trust)
    if attach is not None:
        attach(app, services, settings)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_config=None, access_log=False, loop="asyncio"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: server.started, what="the control plane")
        token = (state_dir / "admin-token").read_text().strip()
        wait_until(
            lambda: services.bus.connected.is_set(), what="the control plane's broker connection"
        )
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120
        ) as admin:
            yield RunningControlPlane(url, services, admin, state_dir)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
