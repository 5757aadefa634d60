"""Agent releases rolled out from the fleet, end to end: a real Mosquitto, a real control
plane, real agents under the real launcher in a temporary root, and releases built at test
time (good, crashing at import, never ready). A good release commits and ``devices show``
names it; a bad one ends back on the previous release with the launcher's reason in
``devices show`` and the rollout rolled back; a rollout paused, resumed and aborted takes the
device back to the release it ran before; an agent not under a launcher is refused with the
reason, and the rollout says so instead of waiting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from common.release_tree import pack
from tests.agent.launcher.harness import ENTRIES, LauncherProcess, cli, free_port
from tests.agent.launcher.test_trial import FAST
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory
from tests.control_plane.server import RunningControlPlane
from tests.control_plane.test_agent_launcher import agent_line
from tests.mqtt_broker import Mosquitto


def start_device(
    cp: RunningControlPlane, broker: Mosquitto, root: Path, device_id: str, **settings: str
) -> LauncherProcess:
    fleet = {
        "MQTT_URL": broker.url,
        "DEVICE_ID": device_id,
        "STATE_DIR": str(root / "agent-state"),
        "TRUST_ROOT_FILE": str(cp.trust_root_file),
        "TELEMETRY_INTERVAL_S": "0.2",
        "RECONNECT_MIN_S": "0.05",
        "RECONNECT_MAX_S": "0.5",
    }
    env = {f"EDGEFLEET_AGENT_FLEET__{k}": v for k, v in fleet.items()}
    launcher = LauncherProcess(root / "launcher", free_port(), {**FAST, **settings}, extra_env=env)
    return launcher.start()


class Operator:
    """``edgefleet`` commands as an operator types them, against ``cp``."""

    def __init__(self, cp: RunningControlPlane, tmp_path: Path) -> None:
        self.cp, self.tmp_path = cp, tmp_path
        self.env = {"EDGEFLEET_URL": cp.url, "EDGEFLEET_TOKEN": cp.token("operator")}

    def run(self, *args: str) -> str:
        done = cli(*args, env=self.env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def push(self, version: str, kind: str) -> None:
        tarball = pack(
            self.tmp_path / f"agent-{version}.tar.gz", version, entry_source=ENTRIES[kind]
        )
        self.run("agents", "push", version, str(tarball))

    def roll_out(self, version: str, *options: str) -> int:
        out = self.run(
            "rollouts", "create", "--agent", version, "--waves", "100%", *options, "--json"
        )
        return int(json.loads(out)["id"])

    def rollout(self, rollout_id: int) -> dict[str, Any]:
        return self.cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()  # type: ignore[no-any-return]

    def wait(self, rollout_id: int, state: str, *, timeout_s: float = 60.0) -> dict[str, Any]:
        docs: list[dict[str, Any]] = []

        def there() -> bool:
            docs.append(self.rollout(rollout_id))
            return docs[-1]["state"] == state

        wait_until(there, timeout_s=timeout_s, what=f"rollout {rollout_id} {state}: {docs[-1:]}")
        return docs[-1]

    def wait_shown(self, device_id: str, text: str) -> str:
        shown: list[str] = []

        def says() -> bool:
            shown.append(agent_line(self.cp, self.env["EDGEFLEET_TOKEN"], device_id))
            return shown[-1].endswith(text)

        wait_until(says, timeout_s=60, what=f"{text!r} in devices show: {shown[-1:]}")
        return shown[-1]


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_good_release_commits_an_aborted_one_goes_back_a_crashing_one_rolls_back(
    start_control_plane: ControlPlaneFactory, broker: Mosquitto, tmp_path: Path
) -> None:
    with start_control_plane() as cp:
        device = start_device(cp, broker, tmp_path, "dev-l", trial_max_launches="2")
        op = Operator(cp, tmp_path)
        try:
            device.wait_running("base")
            op.wait_shown("dev-l", ", release base")
            op.push("2.0.0", "good")
            first = op.roll_out("2.0.0", "--bake-time", "0")
            done = op.wait(first, "succeeded")
            assert done["agent_version"] == "2.0.0" and done["model"] == "@agent"
            assert done["devices"][0]["reason"] == "the launcher committed it"
            op.wait_shown("dev-l", ", release 2.0.0 (2.0.0 committed)")
            listed = op.run("rollouts", "list")
            assert f"rollout {first}: agent release 2.0.0 succeeded" in listed

            # paused, resumed, aborted while it bakes: back to the release it ran before
            op.push("2.1.0", "good")
            second = op.roll_out("2.1.0", "--bake-time", "600")
            wait_until(
                lambda: op.rollout(second)["devices"][0]["state"] == "committed",
                timeout_s=60,
                what="2.1.0 committed on dev-l",
            )
            assert op.run("rollouts", "pause", str(second)).strip() == f"rollout {second}: paused"
            assert op.run("rollouts", "resume", str(second)).strip() == f"rollout {second}: running"
            op.run("rollouts", "abort", str(second))
            aborted = op.wait(second, "rolled_back")
            row = aborted["devices"][0]
            assert (row["state"], row["reason"]) == ("reverted", "runs 2.0.0 again")
            journal = device.wait_running("2.0.0")
            assert journal.previous == "2.1.0"

            # a release crashing at import: back on 2.0.0 within its launches, reason shown
            op.push("3.0.0", "crashing")
            third = op.roll_out("3.0.0", "--bake-time", "0")
            failed = op.wait(third, "rolled_back")
            reason = (
                "rolled_back: crashed before ready (exit 1): ImportError: no module named "
                "agent_core_v3 (a broken release)"
            )
            assert failed["devices"][0]["state"] == "rolled_back"
            assert failed["devices"][0]["reason"] == reason
            assert failed["reason"].endswith(f"first: dev-l: {reason}")
            op.wait_shown("dev-l", f", release 2.0.0 (3.0.0 {reason})")
            journal = device.wait_running("2.0.0")
            assert journal.failed["3.0.0"].startswith("crashed before ready")
        finally:
            assert device.stop() == 0


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_release_never_ready_rolls_back_and_is_not_retried(
    start_control_plane: ControlPlaneFactory, broker: Mosquitto, tmp_path: Path
) -> None:
    with start_control_plane() as cp:
        device = start_device(
            cp, broker, tmp_path, "dev-n", ready_timeout_s="5", trial_max_launches="2"
        )
        op = Operator(cp, tmp_path)
        try:
            device.wait_running("base")
            op.wait_shown("dev-n", ", release base")
            op.push("2.0.0", "never_ready")
            rollout = op.roll_out("2.0.0", "--bake-time", "0")
            failed = op.wait(rollout, "rolled_back")
            assert failed["devices"][0]["reason"] == "rolled_back: not ready within 5 s"
            op.wait_shown("dev-n", ", release base (2.0.0 rolled_back: not ready within 5 s)")
            # the same release again is not retried on this device: refused, nothing restarts
            again = op.wait(op.roll_out("2.0.0", "--bake-time", "0"), "rolled_back")
            assert again["devices"][0]["state"] in ("rejected", "rolled_back")
            assert "not ready within 5 s" in again["devices"][0]["reason"]
            assert device.journal().current == "base"
        finally:
            assert device.stop() == 0


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_agent_not_under_a_launcher_is_refused_with_the_reason(
    start_control_plane: ControlPlaneFactory, start_agent: AgentFactory, tmp_path: Path
) -> None:
    with start_control_plane() as cp, start_agent("dev-a", cp, models=()):
        op = Operator(cp, tmp_path)
        wait_until(
            lambda: cp.admin.get("/api/v1/devices/dev-a").status_code == 200,
            what="dev-a in the inventory",
        )
        op.push("2.0.0", "good")
        rollout = op.wait(op.roll_out("2.0.0"), "rolled_back", timeout_s=30)
        row = rollout["devices"][0]
        assert row["state"] == "rejected"
        assert row["reason"].startswith("no_launcher: the device's status has no launcher report")
        assert rollout["reason"].startswith("1 device(s) refused or rolled back the update")
        status = op.run("rollouts", "status", str(rollout["id"]))
        assert "no_launcher" in status
