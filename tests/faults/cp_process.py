"""The control plane as a real process, alone on its broker: tests/control_plane/process.py's
launcher with the client id of this suite."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.control_plane.process import ControlPlaneProcess
from tests.control_plane.process import control_plane_process as launch

__all__ = ["ControlPlaneProcess", "control_plane_process"]


@contextmanager
def control_plane_process(
    state_dir: Path, db_url: str, mqtt_url: str, port: int
) -> Iterator[ControlPlaneProcess]:
    env = {"EDGEFLEET_CP_MQTT_CLIENT_ID": "edgefleet-cp-faults"}
    with launch("control-plane", state_dir, db_url, mqtt_url, port, env) as running:
        yield running
