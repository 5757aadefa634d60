"""The broker SIGKILLed and restarted several times while a device sends telemetry to a real
control plane on SQLite: every message is counted end to end, from the sequence numbers the
agent's outbox gave out to the rows the control plane stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.fleet.settings import FleetSettings
from tests.agent.server import copy_models, serve, wait_until
from tests.control_plane.server import control_plane
from tests.faults.conftest import missing_telemetry, oldest_held, stored_seqs
from tests.mqtt_broker import Mosquitto, free_port

pytestmark = pytest.mark.slow


RESTARTS = 3


def test_broker_killed_three_times_under_telemetry_loses_nothing_end_to_end(
    broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    db_url = f"sqlite+aiosqlite:///{tmp_path}/cp.db"
    with control_plane(tmp_path / "cp", db_url, broker.url, free_port()) as cp:
        fleet = FleetSettings(
            mqtt_url=broker.url,
            device_id="dev-t",
            state_dir=tmp_path / "state",
            trust_root_file=cp.trust_root_file,
            telemetry_interval_s=0.02,
            reconnect_min_s=0.05,
            reconnect_max_s=0.3,
        )
        repo = copy_models(example_repo, tmp_path / "repo", "mlp")
        with serve(repo, fleet=fleet) as agent:
            client = agent.state.fleet
            assert client is not None
            # killed from the first second on: telemetry leaves the outbox only on the control
            # plane's acknowledgement, never on the broker's PUBACK (agent.fleet.outbox)
            buffered = []
            for _ in range(RESTARTS):
                mark = len(stored_seqs(db_url, "dev-t"))
                wait_until(
                    lambda m=mark: len(stored_seqs(db_url, "dev-t")) > m + 10,
                    what="telemetry reaching the database",
                )
                broker.stop(kill=True)
                wait_until(lambda: not client.connected.is_set(), what="the agent to notice")
                wait_until(lambda: len(client.outbox) >= 10, what="telemetry piling up")
                buffered.append(len(client.outbox))
                broker.start()
                wait_until(lambda: client.connected.is_set(), what="the agent to reconnect")
            produced = client.outbox_seq()
            # every message up to here acknowledged (telemetry still comes every 20 ms, so the
            # outbox itself is empty only by chance)
            wait_until(
                lambda: oldest_held(tmp_path / "state") > produced,
                timeout_s=60,
                what="the outbox to drain",
            )
            assert client.outbox.dropped("telemetry") == 0
        missing = missing_telemetry(db_url, "dev-t", produced)
        assert cp.services.bus.connected.is_set()
    assert broker.starts == RESTARTS + 1 and all(n >= 10 for n in buffered), buffered
    assert not missing, f"telemetry lost: {sorted(missing)[:20]}"


def test_a_broker_that_forgets_everything_in_the_first_second_loses_no_telemetry(
    broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    """A device's first messages, taken by the broker while the control plane is away (its
    session queued there), and the broker killed and started again with its state gone (as
    one without persistence): they come again once the control plane is back, since nothing
    leaves the outbox on the broker's PUBACK. They were lost for good when the PUBACK was
    trusted until the control plane's first acknowledgement."""
    db_url = f"sqlite+aiosqlite:///{tmp_path}/cp.db"
    with control_plane(tmp_path / "cp", db_url, broker.url, free_port()) as cp:
        trust_root = cp.trust_root_file  # the control plane's keys, then it goes away
    fleet = FleetSettings(
        mqtt_url=broker.url,
        device_id="dev-f",
        state_dir=tmp_path / "state",
        trust_root_file=trust_root,
        telemetry_interval_s=0.02,
        telemetry_resend_s=0.5,
        reconnect_min_s=0.05,
        reconnect_max_s=0.3,
    )
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(repo, fleet=fleet) as agent:
        client = agent.state.fleet
        assert client is not None
        wait_until(lambda: client.outbox_seq() >= 20, what="the first telemetry")
        assert not client.outbox.end_to_end and len(client.outbox) >= 20  # all kept
        broker.stop(kill=True)
        for leftover in broker.workdir.glob("mosquitto.db*"):
            leftover.unlink()  # what it held for the control plane is gone
        broker.start()
        with control_plane(tmp_path / "cp", db_url, broker.url, free_port()):
            wait_until(lambda: client.connected.is_set(), what="the agent to reconnect")
            produced = client.outbox_seq()
            wait_until(
                lambda: oldest_held(tmp_path / "state") > produced,
                timeout_s=60,
                what="the outbox to drain",
            )
    missing = missing_telemetry(db_url, "dev-f", produced)
    assert not missing, f"telemetry lost: {sorted(missing)[:20]}"
