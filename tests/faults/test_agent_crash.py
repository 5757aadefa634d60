"""The agent SIGKILLed in the middle of an inference burst: with nothing else going on, once
an update has been downloaded and verified (not yet switched), and right after a commit. In
every case the store on disk is consistent and the restarted agent serves the version the
store's pointer names: the last committed one. (SIGKILL during the download and while the new
version is active but uncommitted: tests/agent/fleet/test_faults.py.)"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from runtimes.examples.variants import mlp_version
from tests.agent.fleet.publisher import Fleet
from tests.agent.fleet.test_faults import _first_loaded, _process_config, _ready
from tests.agent.process import agent_process
from tests.agent.server import copy_models, wait_until
from tests.faults.burst import Burst
from tests.faults.store_check import check_store
from tests.mqtt_broker import Mosquitto

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("kill_at", "expected"),
    [("burst", 1), ("verified", 1), ("committed", 2)],
    ids=["mid-burst", "update-verified-not-switched", "just-committed"],
)
def test_sigkill_during_an_inference_burst_restarts_on_the_committed_version(
    kill_at: str,
    expected: int,
    fleet: Fleet,
    broker: Mosquitto,
    example_repo: Path,
    tmp_path: Path,
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    config = _process_config(tmp_path, fleet, broker, repo)
    with agent_process("--config", str(config)) as agent:
        wait_until(lambda: _ready(agent.address), what="readiness")
        burst = Burst(agent.address).start()
        wait_until(lambda: burst.answered >= 50, what="the burst to flow")
        if kill_at != "burst":
            v2 = mlp_version(tmp_path / "v2", seed=2)
            # a long health window unless the test waits for the commit
            health = {"window_s": 3600} if kill_at == "verified" else {}
            fleet.publish_desired(
                "dev-k", fleet.sign(fleet.manifest("mlp", 2, 1, v2, health=health))
            )
            fleet.wait_event("dev-k", kill_at, sequence=1)
        answered_before = burst.answered
        os.kill(agent.proc.pid, signal.SIGKILL)
        agent.proc.wait(timeout=30)
        wait_until(lambda: len(burst.errors) >= 10, what="requests failing once the agent is gone")
        burst.stop()
    # every request the agent answered before it died was answered properly
    assert set(burst.codes) == {200} and answered_before > 0, burst.codes
    assert check_store(repo, tmp_path / "state", "mlp") == expected
    fleet.publish_desired("dev-k")  # nothing more to apply: what serves is what the store says
    with agent_process("--config", str(config)) as agent:
        assert _first_loaded(agent) == expected
        wait_until(lambda: _ready(agent.address), what="readiness after the restart")
        burst = Burst(agent.address).start()
        wait_until(lambda: burst.answered >= 50, what="the burst after the restart")
        burst.stop()
    assert set(burst.codes) == {200} and set(burst.versions) == {str(expected)}, burst.versions
    assert not [p for p in (repo / ".staging").iterdir() if p.is_dir()]  # recovered
    assert check_store(repo, tmp_path / "state", "mlp") == expected
