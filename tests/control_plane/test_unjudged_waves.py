"""A wave whose gates could not judge (fewer requests than ``min_requests``) waits for traffic
past its bake by default, and says so; once live requests arrive it is judged and goes on. A
rollout created with ``allow_unjudged`` passes such a wave at the end of its bake.

Real Mosquitto, real control plane (SQLite and PostgreSQL), a real agent."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from runtimes.examples.variants import mlp_version
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory, RunningControlPlane
from tests.control_plane.test_rollouts import (
    infer,
    push,
    rollout,
    validate,
    wait_devices,
    wait_rollout,
)

pytestmark = pytest.mark.slow


def doc_of(cp: RunningControlPlane, rollout_id: int) -> dict[str, Any]:
    return cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()  # type: ignore[no-any-return]


def test_a_wave_without_traffic_waits_for_it_then_is_judged(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    with start_control_plane() as cp, start_agent("dev-a", cp) as a:
        wait_devices(cp, "dev-a")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        validate(cp.admin, "mlp", 2)
        gates = {"allow_unjudged": False, "min_requests": 5}
        rollout_id = rollout(cp, 2, waves=["100%"], bake_time_s=0.5, gates=gates)
        wait_until(
            lambda: doc_of(cp, rollout_id)["gate_report"].get("0", {}).get("waiting_for_traffic"),
            what="the wave to wait for traffic",
        )
        time.sleep(2)  # four bakes later: still waiting, not passed
        doc = doc_of(cp, rollout_id)
        assert doc["state"] == "running" and doc["devices"][0]["state"] == "committed"
        status = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
        assert "fewer than 5 requests" in status["gate_report"]["0"]["note"]
        for _ in range(10):  # live requests on the new version
            assert infer(a).json()["model_version"] == "2"
        done = wait_rollout(cp, rollout_id, "succeeded", timeout_s=60)
        report = done["gate_report"]["0"]
        assert report["requests"] >= 5 and "note" not in report


def test_allow_unjudged_passes_a_wave_without_traffic_at_the_end_of_its_bake(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    with start_control_plane() as cp, start_agent("dev-a", cp):
        wait_devices(cp, "dev-a")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        validate(cp.admin, "mlp", 2)
        rollout_id = rollout(cp, 2, waves=["100%"], gates={"allow_unjudged": True})
        done = wait_rollout(cp, rollout_id, "succeeded")
        assert "not judged" in done["gate_report"]["0"]["note"]
