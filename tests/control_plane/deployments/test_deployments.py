"""Continuous deployments end to end: a device that joins by claim converges to its group's
deployment through a rollout of its own; relabelled, it converges to its new group's version;
a deployment's new version is a rollout; its status counts devices in and out of compliance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtimes.examples.variants import mlp_version
from tests.agent.server import RunningAgent, wait_until
from tests.control_plane.enrolment.conftest import ClaimedAgent, new_claim
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_rollouts import push, served, validate

FAST = {
    "waves": ["1", "100%"],
    "bake_time_s": 0.2,
    "device_timeout_s": 60,
    "gates": {"allow_unjudged": True},
}


def deploy(cp: RunningControlPlane, name: str, version: int, group: str) -> dict[str, Any]:
    spec = {"name": name, "model": "mlp", "version": version, "selector": {"group": group}}
    resp = cp.admin.post("/api/v1/deployments", json={**spec, **FAST})
    assert resp.status_code == 201, resp.text
    return resp.json()  # type: ignore[no-any-return]


def converged(cp: RunningControlPlane, agent: RunningAgent, name: str, version: int) -> None:
    def done() -> bool:
        doc = cp.admin.get(f"/api/v1/deployments/{name}").json()
        status = doc["status"]
        return (
            served(agent) == str(version)
            and status["in_compliance"] == 1
            and status["active_rollout"] is None  # its rollout finished, gates passed
        )

    try:
        wait_until(done, timeout_s=60, what=f"the device on v{version} of deployment {name}")
    except TimeoutError as exc:  # the rollouts' states and reasons say why it did not get there
        rollouts = [
            (r["version"], r["state"], r.get("reason"))
            for r in cp.admin.get("/api/v1/rollouts").json()
        ]
        raise TimeoutError(f"{exc}; rollouts: {rollouts}; device serves {served(agent)}") from None


@pytest.mark.slow
@pytest.mark.parametrize("cp", ["sqlite", "postgresql"], indirect=True)
def test_devices_converge_to_their_groups_deployment(
    cp: RunningControlPlane, claimed_agent: ClaimedAgent, tmp_path: Path
) -> None:
    for version in (2, 3):
        push(cp.admin, "mlp", version, [(mlp_version(tmp_path / f"v{version}", seed=version), [])])
        assert validate(cp.admin, "mlp", version)["passed"]
    deploy(cp, "x86-fleet", 2, "x86")
    deploy(cp, "pi-fleet", 3, "pi")
    empty = cp.admin.get("/api/v1/deployments").json()
    assert [d["status"]["devices"] for d in empty] == [0, 0]

    token = new_claim(cp, labels={"group": "x86"})
    with claimed_agent("dev-new", token) as agent:
        # it joins with nothing but the claim, and its group's deployment reaches it
        converged(cp, agent, "x86-fleet", 2)
        doc = cp.admin.get("/api/v1/deployments/x86-fleet").json()
        assert doc["devices"] == {"dev-new": "compliant"}
        assert doc["status"]["states"]["compliant"] == 1 and doc["problem"] is None
        rollouts = cp.admin.get("/api/v1/rollouts").json()
        assert [(r["version"], r["state"]) for r in rollouts] == [(2, "succeeded")]

        # relabelled, it leaves x86-fleet and converges to pi-fleet's version
        resp = cp.admin.patch("/api/v1/devices/dev-new/labels", json={"labels": {"group": "pi"}})
        assert resp.status_code == 200
        converged(cp, agent, "pi-fleet", 3)
        assert cp.admin.get("/api/v1/deployments/x86-fleet").json()["status"]["devices"] == 0

        # a new version of a deployment is a rollout to its devices, with its waves and gates
        resp = cp.admin.patch("/api/v1/deployments/pi-fleet", json={"version": 2})
        assert resp.status_code == 200, resp.text
        assert resp.json()["status"]["out_of_compliance"] == 1
        converged(cp, agent, "pi-fleet", 2)
        newest = cp.admin.get("/api/v1/rollouts").json()[0]
        assert (newest["version"], newest["state"], newest["gates"]["allow_unjudged"]) == (
            2,
            "succeeded",
            True,
        )


@pytest.mark.slow
def test_deployments_refuse_what_could_never_roll_out(cp: RunningControlPlane) -> None:
    resp = cp.admin.post(
        "/api/v1/deployments", json={"name": "d", "model": "mlp", "version": 9, **FAST}
    )
    assert resp.status_code == 404, resp.text  # no such version
    resp = cp.admin.post(
        "/api/v1/deployments",
        json={"name": "d", "model": "mlp", "version": 1, **FAST, "waves": ["0"]},
    )
    assert resp.status_code == 400 and "waves" in resp.json()["error"]
    shadow = {"sample_share": 0.5, "min_agreement": 0.9}
    resp = cp.admin.post(
        "/api/v1/deployments",
        json={"name": "d", "model": "mlp", "version": 1, **FAST, "shadow": shadow},
    )
    assert resp.status_code == 400 and "shadow" in resp.json()["error"], resp.text
    resp = cp.admin.patch("/api/v1/deployments/nope", json={"version": 2})
    assert resp.status_code == 404
    with cp.client(cp.token("viewer")) as viewer:
        assert viewer.post("/api/v1/deployments", json={"name": "d"}).status_code == 403
