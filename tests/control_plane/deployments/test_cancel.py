"""Cancelling a rollout whose devices wait for their maintenance windows (issue 47, item 5):
the device that switched keeps the new version, the one that downloaded ahead and waits is
withdrawn: its desired state restored, it drops what it staged and never switches. The CLI's
answer, the API's and the device view say so; no false alarm follows on the device."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from common.cli import root
from runtimes.examples.variants import mlp_version
from tests.agent.server import wait_until
from tests.control_plane.enrolment.conftest import ClaimedAgent, new_claim
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_rollouts import push, served, validate


def events(cp: RunningControlPlane, device_id: str) -> list[dict[str, Any]]:
    answer = cp.admin.get(f"/api/v1/devices/{device_id}/events")
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


@pytest.mark.slow
def test_cancel_withdraws_scheduled_switches_and_keeps_the_switched(
    cp: RunningControlPlane, claimed_agent: ClaimedAgent, tmp_path: Path
) -> None:
    push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
    assert validate(cp.admin, "mlp", 2)["passed"]
    later = (datetime.now(UTC) + timedelta(minutes=30)).minute
    window = {
        "name": "later",
        "cron": f"{later} * * * *",
        "duration_s": 60,
        "timezone": "UTC",
        "selector": {"site": "later"},
    }
    answer = cp.admin.post("/api/v1/maintenance-windows", json=window)
    assert answer.status_code == 201, answer.text
    opens = answer.json()["next_open"]
    env = {"EDGEFLEET_URL": cp.url, "EDGEFLEET_TOKEN": cp.token("operator", "ops")}

    def run(*args: str) -> str:
        result = CliRunner().invoke(root(), list(args), env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    with (
        claimed_agent("dev-now", new_claim(cp, labels={"lab": "cancel", "site": "now"})) as now,
        claimed_agent("dev-later", new_claim(cp, labels={"lab": "cancel", "site": "later"})) as w,
    ):
        for device_id in ("dev-now", "dev-later"):
            wait_until(
                lambda d=device_id: cp.admin.get(f"/api/v1/devices/{d}").json().get("online"),
                what=f"{device_id} online",
            )
        spec = {"model": "mlp", "version": 2, "selector": {"lab": "cancel"}, "waves": ["100%"]}
        spec |= {"bake_time_s": 0.2, "gates": {"allow_unjudged": True}}
        created = cp.admin.post("/api/v1/rollouts", json=spec)
        assert created.status_code == 201, created.text
        rollout_id = created.json()["id"]
        path = f"/api/v1/rollouts/{rollout_id}"

        def device_state(device_id: str) -> str:
            rows = {d["device_id"]: d for d in cp.admin.get(path).json()["devices"]}
            return str(rows[device_id]["state"])

        wait_until(lambda: device_state("dev-now") == "committed", what="dev-now switched")
        wait_until(
            lambda: any(e["state"] == "verified" for e in events(cp, "dev-later")),
            what="dev-later downloaded ahead of its window",
        )
        assert device_state("dev-later") == "sent"
        shown = run("devices", "show", "dev-later")
        assert f"switch         mlp v2 scheduled at {opens} (rollout {rollout_id})" in shown

        answer = run("rollouts", "cancel", str(rollout_id))
        assert answer == (
            f"rollout {rollout_id}: cancelled: 1 scheduled switch(es) withdrawn (those devices "
            "never switch), 1 device(s) switched or switching keep v2 (abort rolls back), "
            "0 not reached\n"
        )
        doc = cp.admin.get(path).json()
        assert doc["cancelled"] | {"summary": ""} == {
            "withdrawn": 1,
            "kept": 1,
            "not_reached": 0,
            "shadows": 0,
            "other": 0,
            "summary": "",
        }
        rows = {d["device_id"]: d for d in doc["devices"]}
        assert rows["dev-later"]["state"] == "withdrawn"
        assert rows["dev-later"]["reason"].startswith(f"switch at {opens} withdrawn by the cancel")
        assert rows["dev-now"]["state"] == "committed"

        # the device drops what it staged, and says so: its switch never fires
        def superseded() -> list[dict[str, Any]]:
            return [e for e in events(cp, "dev-later") if e.get("code") == "superseded"]

        wait_until(superseded, what="dev-later to drop the withdrawn update")
        wait_until(
            lambda: rows_reason(cp, path, "dev-later").endswith("the device dropped it"),
            what="the device's answer on the rollout",
        )
        # the restored desired state (v1's manifest, signed again) is what runs: no refusal
        refused = [e for e in events(cp, "dev-later") if e["state"] == "rejected"]
        assert [e.get("code") for e in refused] == ["superseded"]
        assert served(w) == "1" and served(now) == "2"
        shown = run("devices", "show", "dev-later")
        assert (
            f"switch         mlp v2 withdrawn: rollout {rollout_id} cancelled, it never switches"
        ) in shown
        assert "switch " not in run("devices", "show", "dev-now")


def rows_reason(cp: RunningControlPlane, path: str, device_id: str) -> str:
    rows = {d["device_id"]: d for d in cp.admin.get(path).json()["devices"]}
    return str(rows[device_id]["reason"])
