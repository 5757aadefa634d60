"""A real Mosquitto with the two listeners ``FleetAccess.write_config`` writes, on free ports:
the devices' (``port``: devices and the dashboard) and the control plane's (``cp_port``: its
user alone), each with its own password file, ACL and CRL."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from control_plane.provisioning.mosquitto import FleetAccess
from tests.control_plane.conftest import ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane, control_plane
from tests.mqtt_broker import Mosquitto, free_port


class FleetBroker(Mosquitto):
    def __init__(self, workdir: Path, access: FleetAccess, out: Path, *, tls: bool) -> None:
        self.cp_port = free_port()
        self.scheme = "mqtts" if tls else "mqtt"
        extra = (
            "per_listener_settings true\n"
            + access.listener_options(out, tls=tls)
            + f"listener {self.cp_port} 127.0.0.1\n"
            + access.control_plane_listener_options(out, tls=tls)
        )
        super().__init__(workdir, extra_config=extra)

    @property
    def url(self) -> str:
        """The devices' listener."""
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def control_plane_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.cp_port}"


def on_control_plane_listener(
    tmp_path: Path, db_url: str, broker: FleetBroker
) -> ControlPlaneFactory:
    """``start_control_plane`` (tests/control_plane/conftest.py) on the control plane's own
    listener: its credentials are refused on the devices'."""
    port = free_port()

    def start(**overrides: Any) -> AbstractContextManager[RunningControlPlane]:
        state = tmp_path / "cp-state"
        return control_plane(state, db_url, broker.control_plane_url, port, **overrides)

    return start
