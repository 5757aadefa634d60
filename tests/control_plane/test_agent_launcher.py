"""An agent under its launcher, joined to a real control plane through a real Mosquitto:
releases built at test time go on trial on the device, and ``edgefleet devices show`` tells
the operator which release runs and how the last trial ended (``rolled_back`` with its
reason), from the launcher's report in the agent's birth message."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent.launcher.harness import LauncherProcess, build_release, cli, free_port
from tests.agent.launcher.test_trial import FAST
from tests.agent.server import wait_until
from tests.control_plane.conftest import ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane
from tests.mqtt_broker import Mosquitto


def agent_line(cp: RunningControlPlane, token: str, device_id: str) -> str:
    env = {"EDGEFLEET_URL": cp.url, "EDGEFLEET_TOKEN": token}
    shown = cli("devices", "show", device_id, env=env)
    if shown.returncode != 0:
        return ""  # not heard from yet
    return next(line for line in shown.stdout.splitlines() if line.startswith("  agent "))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_devices_show_the_release_and_the_last_trial(
    start_control_plane: ControlPlaneFactory, broker: Mosquitto, tmp_path: Path
) -> None:
    with start_control_plane() as cp:
        fleet = {
            "MQTT_URL": broker.url,
            "DEVICE_ID": "dev-l",
            "STATE_DIR": str(tmp_path / "agent-state"),
            "TRUST_ROOT_FILE": str(cp.trust_root_file),
            "TELEMETRY_INTERVAL_S": "0.2",
            "RECONNECT_MIN_S": "0.05",
            "RECONNECT_MAX_S": "0.5",
        }
        env = {f"EDGEFLEET_AGENT_FLEET__{k}": v for k, v in fleet.items()}
        launcher = LauncherProcess(tmp_path / "launcher", free_port(), dict(FAST), extra_env=env)
        launcher.start()
        viewer = cp.token("viewer")
        try:
            launcher.wait_running("base")
            shown: list[str] = []

            def says(text: str) -> bool:
                shown.append(agent_line(cp, viewer, "dev-l"))
                return shown[-1].endswith(text)

            wait_until(lambda: says(", release base"), what="dev-l on release base")
            cli(
                "launcher",
                "install",
                "--root",
                str(launcher.root),
                str(build_release(tmp_path, "3.0.0", "crashing")),
            )
            rolled_back = (
                ", release base (3.0.0 rolled_back: crashed before ready (exit 1): "
                "ImportError: no module named agent_core_v3 (a broken release))"
            )
            wait_until(
                lambda: says(rolled_back), what=f"the rollback in devices show: {shown[-1:]}"
            )
            cli(
                "launcher",
                "install",
                "--root",
                str(launcher.root),
                str(build_release(tmp_path, "2.0.0", "good")),
            )
            wait_until(
                lambda: says(", release 2.0.0 (2.0.0 committed)"),
                what=f"the commit in devices show: {shown[-1:]}",
            )
            assert shown[-1].startswith("  agent          0.")
        finally:
            assert launcher.stop() == 0
