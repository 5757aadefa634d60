"""Control plane fixtures: a broker, a control plane on SQLite or PostgreSQL (every test runs on
both), and real agents of two hardware profiles joined to it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agent.fleet.settings import FleetSettings
from tests.agent.server import RunningAgent, copy_models, serve
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.mqtt_broker import Mosquitto, free_port

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path}/control-plane.db"
        return
    name = f"edgefleet_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    mosquitto = Mosquitto(tmp_path / "broker").start()
    yield mosquitto
    mosquitto.stop()


ControlPlaneFactory = Callable[..., AbstractContextManager[RunningControlPlane]]


@pytest.fixture
def start_control_plane(tmp_path: Path, db_url: str, broker: Mosquitto) -> ControlPlaneFactory:
    """Start (or restart, on the same database and state) the control plane."""

    port = free_port()  # kept across restarts: manifests carry artifact URLs on it

    def start(**overrides: Any) -> AbstractContextManager[RunningControlPlane]:
        return control_plane(tmp_path / "cp-state", db_url, broker.url, port, **overrides)

    return start


AgentFactory = Callable[..., AbstractContextManager[RunningAgent]]

# Two kinds of device: this machine as detected, and one forced to the Raspberry Pi 5 profile
# (its CPU runtimes run here for real; only the profile name differs).
DEVICES = {
    "dev-a": ("auto", {"site": "lab", "group": "x86"}),
    "dev-b": ("raspberry-pi-5", {"site": "lab", "group": "pi"}),
}


@pytest.fixture
def start_agent(
    example_repo: Path, tmp_path: Path, broker: Mosquitto
) -> Callable[..., AbstractContextManager[RunningAgent]]:
    def start(
        device_id: str,
        cp: RunningControlPlane,
        *,
        models: tuple[str, ...] = ("mlp",),
        device_hourly_cost: float | None = None,
        **overrides: Any,
    ) -> AbstractContextManager[RunningAgent]:
        """``models``: the example models its repository starts with (at its first start);
        ``device_hourly_cost``: the agent's, for the costs its telemetry reports."""
        profile, labels = DEVICES[device_id]
        repo = tmp_path / f"repo-{device_id}"
        if not repo.exists():
            copy_models(example_repo, repo, *models)
        fleet = FleetSettings(
            mqtt_url=broker.url,
            device_id=device_id,
            labels=labels,
            state_dir=tmp_path / f"state-{device_id}",
            trust_root_file=cp.trust_root_file,
            telemetry_interval_s=0.2,
            reconnect_min_s=0.05,
            reconnect_max_s=0.5,
            **overrides,
        )
        return serve(repo, profile=profile, fleet=fleet, device_hourly_cost=device_hourly_cost)

    return start
