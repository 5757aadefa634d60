"""Each device of a rollout shows its phase as it reports it: in its health window with the
seconds left while its row says ``sent``, then committed; its download's bytes are stored with
its events.

Real Mosquitto, real control plane (SQLite and PostgreSQL), a real agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtimes.examples.variants import mlp_version
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory, RunningControlPlane
from tests.control_plane.test_rollouts import (
    DEVICE_HEALTH,
    push,
    rollout,
    validate,
    wait_devices,
    wait_rollout,
)

pytestmark = pytest.mark.slow

WINDOW_S = 6.0


def device(cp: RunningControlPlane, rollout_id: int) -> dict[str, Any]:
    (only,) = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()["devices"]
    return only  # type: ignore[no-any-return]


def test_a_device_shows_its_health_window_then_its_commit(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    health = {**DEVICE_HEALTH, "window_s": WINDOW_S}
    with start_control_plane() as cp, start_agent("dev-a", cp):
        wait_devices(cp, "dev-a")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])], health=health)
        validate(cp.admin, "mlp", 2)
        rollout_id = rollout(cp, 2, waves=["100%"], selector={"site": "lab"})
        wait_until(
            lambda: (device(cp, rollout_id)["phase"] or {}).get("state") == "active",
            what="dev-a in its health window",
        )
        seen = device(cp, rollout_id)
        assert seen["state"] == "sent"  # the rollout's row: no outcome yet
        assert seen["phase"]["window_s"] == WINDOW_S
        assert 0 < seen["phase"]["window_left_s"] <= WINDOW_S
        wait_rollout(cp, rollout_id, "succeeded")
        done = device(cp, rollout_id)
        assert done["state"] == "committed" and done["phase"]["state"] == "committed"
        events = cp.admin.get("/api/v1/devices/dev-a/events").json()
        downloads = [e for e in events if e["state"] == "downloading" and e.get("bytes_total")]
        assert downloads and downloads[-1]["bytes_done"] == downloads[-1]["bytes_total"] > 0
