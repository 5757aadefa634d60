"""Fixtures for fleet tests: a private Mosquitto, an artifact server, the test-side fleet, and
agents with the fleet client on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from agent.fleet.settings import FleetSettings
from tests.agent.fleet.artifacts import ArtifactServer, artifact_server
from tests.agent.fleet.publisher import Fleet
from tests.agent.server import RunningAgent, copy_models, serve
from tests.mqtt_broker import Mosquitto


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    mosquitto = Mosquitto(tmp_path / "broker").start()
    yield mosquitto
    mosquitto.stop()


@pytest.fixture
def artifacts(tmp_path: Path) -> Iterator[ArtifactServer]:
    with artifact_server(tmp_path / "artifacts") as server:
        yield server


@pytest.fixture
def fleet(broker: Mosquitto, artifacts: ArtifactServer) -> Iterator[Fleet]:
    f = Fleet(broker.url, artifacts)
    yield f
    f.close()


def fleet_settings(
    fleet: Fleet, broker: Mosquitto, state_dir: Path, **overrides: Any
) -> FleetSettings:
    trust = fleet.write_trust_root(state_dir.parent / f"{state_dir.name}-trust.json")
    values: dict[str, Any] = {
        "mqtt_url": broker.url,
        "device_id": "dev-1",
        "state_dir": state_dir,
        "trust_root_file": trust,
        "telemetry_interval_s": 0.2,
        "labels": {"site": "lab"},
        "reconnect_min_s": 0.05,
        "reconnect_max_s": 0.5,
        "download_attempts": 3,
    }
    values.update(overrides)
    return FleetSettings(**values)


AgentFactory = Callable[..., AbstractContextManager[RunningAgent]]


@pytest.fixture
def fleet_agent(
    example_repo: Path, tmp_path: Path, fleet: Fleet, broker: Mosquitto
) -> AgentFactory:
    """Start an agent serving the example mlp (version 1) with its fleet client on."""

    def start(
        *, device_id: str = "dev-1", repo: Path | None = None, **fleet_overrides: Any
    ) -> AbstractContextManager[RunningAgent]:
        repository = repo or copy_models(example_repo, tmp_path / f"repo-{device_id}", "mlp")
        settings = fleet_settings(
            fleet, broker, tmp_path / f"state-{device_id}", device_id=device_id, **fleet_overrides
        )
        return serve(repository, fleet=settings)

    return start
