"""A broker that lost its state (restarted without its persistence, or replaced) while the
control plane runs: the retained desired states and trust root are published again, and a
rollback command it held for an offline device is sent again when the device is back.

Real Mosquitto, real control plane (SQLite and PostgreSQL), a real agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.protocol.messages import DesiredState
from runtimes.examples.variants import mlp_version
from tests.access.mqtt_client import ProbeClient
from tests.agent.server import wait_until
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory, RunningControlPlane
from tests.control_plane.test_rollouts import (
    push,
    rollout,
    served,
    validate,
    wait_devices,
    wait_rollout,
)
from tests.mqtt_broker import Mosquitto

DESIRED = "edgefleet/devices/dev-a/desired"
TRUST = "edgefleet/fleet/trust"


def _lose_broker_state(broker: Mosquitto) -> None:
    broker.stop(kill=True)  # no will published, nothing saved on the way out
    lost = list(broker.workdir.glob("*.db"))
    assert lost, "no persistence file: the test would prove nothing"
    for path in lost:
        path.unlink()
    broker.start()  # a broker with no sessions and no retained messages


@pytest.mark.slow
def test_a_broker_that_lost_its_state_gets_the_retained_state_again(
    start_control_plane: ControlPlaneFactory,
    start_agent: AgentFactory,
    broker: Mosquitto,
    tmp_path: Path,
) -> None:
    with start_control_plane() as cp, start_agent("dev-a", cp) as a:
        wait_devices(cp, "dev-a")
        push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
        validate(cp.admin, "mlp", 2)
        wait_rollout(cp, rollout(cp, 2, waves=["100%"]), "succeeded")
        assert served(a) == "2"

        _lose_broker_state(broker)

        watcher = ProbeClient(broker.port)
        try:
            assert watcher.connect() == 0
            watcher.subscribe(DESIRED)
            watcher.subscribe(TRUST)
            desired = watcher.wait(lambda: watcher.messages(DESIRED), "the desired state again")
            assert watcher.wait(lambda: watcher.messages(TRUST), "the trust root again")
        finally:
            watcher.close()
        state = DesiredState.model_validate_json(desired[-1])
        assert state.device_id == "dev-a"
        assert [m["signed"]["version"] for m in state.manifests] == [2]
        assert served(a) == "2"  # converged: the device stays where it is


def _device_state(cp: RunningControlPlane, rollout_id: int) -> tuple[str, Any]:
    doc = cp.admin.get(f"/api/v1/rollouts/{rollout_id}").json()
    return doc["state"], {d["device_id"]: d["state"] for d in doc["devices"]}


@pytest.mark.slow
def test_a_rollback_command_the_broker_lost_is_sent_again_when_the_device_is_back(
    start_control_plane: ControlPlaneFactory,
    start_agent: AgentFactory,
    broker: Mosquitto,
    tmp_path: Path,
) -> None:
    with start_control_plane() as cp:
        with start_agent("dev-a", cp) as a:
            wait_devices(cp, "dev-a")
            push(cp.admin, "mlp", 2, [(mlp_version(tmp_path / "v2", seed=2), [])])
            validate(cp.admin, "mlp", 2)
            # one wave, baking long: still running (abortable) once the device committed
            rollout_id = rollout(cp, 2, waves=["100%"], bake_time_s=600, device_timeout_s=300)
            wait_until(
                lambda: _device_state(cp, rollout_id) == ("running", {"dev-a": "committed"}),
                what="dev-a to commit version 2",
            )
            assert served(a) == "2"
        # dev-a is offline; the rollback command waits for it in its session on the broker
        assert cp.admin.post(f"/api/v1/rollouts/{rollout_id}/abort").status_code == 200
        wait_until(
            lambda: _device_state(cp, rollout_id) == ("rolling_back", {"dev-a": "reverting"}),
            what="the rollback command sent",
        )
        _lose_broker_state(broker)  # and the command with it
        # the control plane is back on the broker and has resynced (the retained trust root
        # is there again) while dev-a is still away: what it sends dev-a now is dropped
        watcher = ProbeClient(broker.port)
        try:
            assert watcher.connect() == 0
            watcher.subscribe(TRUST)
            assert watcher.wait(lambda: watcher.messages(TRUST), "the trust root again")
        finally:
            watcher.close()
        with start_agent("dev-a", cp) as a:
            # well inside device_timeout_s: without the command again, it stays reverting
            doc = wait_rollout(cp, rollout_id, "rolled_back", timeout_s=60)
            assert {d["device_id"]: d["state"] for d in doc["devices"]} == {"dev-a": "reverted"}
            assert served(a) == "1"
