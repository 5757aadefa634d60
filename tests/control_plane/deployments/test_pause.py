"""A paused deployment (issue 53's "pause"): it starts no rollout for a device that joins its
group, its running rollout pauses with it, and resumed, both go on. A real broker with the
dynamic security plugin, a control plane, a device that joins by claim; the operator's
commands through the real CLI."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from runtimes.examples.variants import mlp_version
from tests.agent.server import wait_until
from tests.control_plane.deployments.test_deployments import FAST
from tests.control_plane.enrolment.conftest import ClaimedAgent, new_claim
from tests.control_plane.quality.conftest import edgefleet
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_rollouts import push, served, validate


def deployment(cp: RunningControlPlane) -> dict[str, Any]:
    doc: dict[str, Any] = cp.admin.get("/api/v1/deployments/held").json()
    return doc


def rollout_state(cp: RunningControlPlane, rollout_id: int) -> str:
    state: str = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()["state"]
    return state


def test_a_paused_deployment_starts_nothing_and_holds_its_rollout(
    cp: RunningControlPlane, claimed_agent: ClaimedAgent, tmp_path: Path
) -> None:
    push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
    assert validate(cp.admin, "mlp", 2)["passed"]
    spec = {"name": "held", "model": "mlp", "version": 2, "selector": {"group": "x86"}}
    created = cp.admin.post("/api/v1/deployments", json={**spec, **FAST, "bake_time_s": 600})
    assert created.status_code == 201, created.text
    paused = edgefleet(cp, "deployments", "pause", "held")
    assert paused.returncode == 0, paused.stderr
    assert ", paused by " in paused.stdout, paused.stdout

    with claimed_agent("dev-held", new_claim(cp, labels={"group": "x86"})) as agent:
        wait_until(
            lambda: deployment(cp)["devices"].get("dev-held") == "pending",
            what="the joined device out of compliance",
        )
        # NOTE: an absence: the reconciler passes every 0.2 s here, ten passes start nothing
        time.sleep(2.0)
        assert cp.admin.get("/api/v1/rollouts").json() == []
        assert served(agent) == "1" and deployment(cp)["status"]["active_rollout"] is None

        resumed = edgefleet(cp, "deployments", "resume", "held")
        assert resumed.returncode == 0 and "paused" not in resumed.stdout, resumed.stdout
        wait_until(lambda: served(agent) == "2", timeout_s=60, what="v2 on the device")
        active = deployment(cp)["status"]["active_rollout"]
        assert active is not None and rollout_state(cp, active) == "running"  # baking

        # pausing the deployment pauses its running rollout; resuming lets it go on
        assert cp.admin.post("/api/v1/deployments/held/pause").json()["paused"] is True
        assert rollout_state(cp, active) == "paused"
        assert cp.admin.post("/api/v1/deployments/held/resume").json()["paused"] is False
        assert rollout_state(cp, active) == "running"
    refused = cp.admin.post("/api/v1/deployments/held/stop")
    assert refused.status_code == 404 and "pause or resume" in refused.text
    with cp.client(cp.token("viewer")) as viewer:
        assert viewer.post("/api/v1/deployments/held/pause").status_code == 403
