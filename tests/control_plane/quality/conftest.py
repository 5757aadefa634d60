"""Quality fixtures: one control plane (SQLite) for the module, and the trained digits example."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtimes.examples import write_example_repository
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.mqtt_broker import Mosquitto, free_port


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    mosquitto = Mosquitto(tmp_path_factory.mktemp("quality-broker")).start()
    yield mosquitto
    mosquitto.stop()


@pytest.fixture(scope="module")
def cp(
    tmp_path_factory: pytest.TempPathFactory, broker: Mosquitto
) -> Iterator[RunningControlPlane]:
    root = tmp_path_factory.mktemp("quality-cp")
    db = f"sqlite+aiosqlite:///{root}/cp.db"
    with control_plane(root / "cp", db, broker.url, free_port()) as running:
        yield running


@pytest.fixture(scope="session")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits (trained) and mlp (random weights) examples, with their reference sets."""
    root = tmp_path_factory.mktemp("quality-examples")
    write_example_repository(root, models=("digits", "mlp"))
    return root


def edgefleet(cp: RunningControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI, as an operator runs it (admin token)."""
    exe = Path(sys.executable).parent / "edgefleet"
    token = cp.admin.headers["Authorization"].removeprefix("Bearer ")
    env = {**os.environ, "EDGEFLEET_URL": cp.url, "EDGEFLEET_TOKEN": token}
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=120)
