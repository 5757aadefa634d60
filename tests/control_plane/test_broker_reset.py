"""A broker that lost its state (restarted without its persistence, or replaced) while the
control plane runs: the retained desired states and trust root are published again.

Real Mosquitto, real control plane (SQLite and PostgreSQL), a real agent."""

from __future__ import annotations

from pathlib import Path

from agent.protocol.messages import DesiredState
from runtimes.examples.variants import mlp_version
from tests.access.mqtt_client import ProbeClient
from tests.control_plane.conftest import AgentFactory, ControlPlaneFactory
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

        broker.stop(kill=True)  # no will published, nothing saved on the way out
        lost = list(broker.workdir.glob("*.db"))
        assert lost, "no persistence file: the test would prove nothing"
        for path in lost:
            path.unlink()
        broker.start()  # a broker with no sessions and no retained messages

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
