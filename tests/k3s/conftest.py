"""The control plane with its Kubernetes controller on a fake API server (the seam), a real
Mosquitto and real agents: the fixtures of tests/control_plane, on SQLite."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.control_plane.conftest import broker, start_agent
from tests.control_plane.server import RunningControlPlane
from tests.k3s.fake_kube import FakeKubeApi
from tests.k3s.server import control_plane_in_cluster
from tests.mqtt_broker import Mosquitto, free_port

__all__ = ["broker", "start_agent"]  # fixtures shared with tests/control_plane

ClusterControlPlane = Callable[..., AbstractContextManager[RunningControlPlane]]


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path}/control-plane.db"


@pytest.fixture
def kube() -> FakeKubeApi:
    return FakeKubeApi()


@pytest.fixture
def start_in_cluster(
    tmp_path: Path, db_url: str, broker: Mosquitto, kube: FakeKubeApi
) -> ClusterControlPlane:
    """Start (or restart, on the same database and state) the control plane with
    kubernetes.enabled, its controller talking to ``kube``."""
    port = free_port()

    def start(**overrides: Any) -> AbstractContextManager[RunningControlPlane]:
        return control_plane_in_cluster(
            tmp_path / "cp-state", db_url, broker.url, port, kube, **overrides
        )

    return start
