"""Devices whose agent crash-loops or went back from a release, as the fleet sees them: their
launcher's report in the status message (over a real broker, stored by the real ingest, on
SQLite and PostgreSQL) is counted in the summary and filters the device list, which the
console's overview turns into its alerts (tests/control_plane/console/test_views.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from common.protocol.messages import (
    AgentPhase,
    AgentReleaseOutcome,
    AgentUpdate,
    DeviceStatus,
    LauncherReport,
)
from tests.access.mqtt_client import ProbeClient
from tests.agent.server import wait_until
from tests.control_plane.conftest import ControlPlaneFactory
from tests.mqtt_broker import Mosquitto

NOW = datetime.now(UTC)
REPORTS = {
    "dev-looping": LauncherReport(
        release="1.4.0", phase=AgentPhase.DEGRADED, last_error="exit 1", exits_in_a_row=4
    ),
    "dev-back": LauncherReport(
        release="1.3.0",
        phase=AgentPhase.RUNNING,
        last_update=AgentUpdate(
            version="1.4.0",
            outcome=AgentReleaseOutcome.ROLLED_BACK,
            reason="not ready within 30 s",
            at=NOW,
        ),
    ),
    "dev-fine": LauncherReport(
        release="1.4.0",
        phase=AgentPhase.RUNNING,
        last_update=AgentUpdate(version="1.4.0", outcome=AgentReleaseOutcome.COMMITTED, at=NOW),
    ),
}


def test_degraded_and_rolled_back_agents_are_counted_and_filtered(
    start_control_plane: ControlPlaneFactory, broker: Mosquitto, tmp_path: Path
) -> None:
    with start_control_plane() as cp:
        for device_id, report in REPORTS.items():
            device = ProbeClient(broker.port, client_id=device_id)
            assert device.connect() == 0
            status = DeviceStatus(device_id=device_id, online=True, launcher=report)
            info = device.client.publish(
                f"edgefleet/devices/{device_id}/status",
                status.model_dump_json(),
                qos=1,
                retain=True,
            )
            info.wait_for_publish(timeout=10)
            device.close()
        wait_until(
            lambda: len(cp.admin.get("/api/v1/devices").json()) == 3, what="the three devices"
        )
        summary = cp.admin.get("/api/v1/devices/summary").json()
        assert summary["agents"] == {"degraded": 1, "rolled_back": 1}
        for state, expected in (("degraded", "dev-looping"), ("rolled_back", "dev-back")):
            found = cp.admin.get("/api/v1/devices", params={"agent": state}).json()
            assert [d["id"] for d in found] == [expected]
            assert found[0]["launcher"]["release"] == REPORTS[expected].release
        bad = cp.admin.get("/api/v1/devices", params={"agent": "sad"})
        assert bad.status_code in (400, 422) and "agent" in bad.text, bad.text
