"""Fixtures for the fault tests: a private broker, the fleet test side, and what the tests
use to count telemetry end to end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from control_plane.db.session import sync_url
from tests.fleet.artifacts import ArtifactServer, artifact_server
from tests.fleet.publisher import Fleet
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


def stored_seqs(db_url: str, device_id: str) -> set[int]:
    """Sequence numbers of the telemetry messages the control plane stored for a device."""
    engine = create_engine(sync_url(db_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT seq FROM device_telemetry WHERE device_id = :d"), {"d": device_id}
            )
            return {int(r[0]) for r in rows}
    finally:
        engine.dispose()


def missing_telemetry(
    db_url: str, device_id: str, produced: int, timeout_s: float = 60
) -> set[int]:
    """The sequence numbers 1..produced not stored, once all are or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while missing := set(range(1, produced + 1)) - stored_seqs(db_url, device_id):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)  # a database poll: the count only grows
    return missing
