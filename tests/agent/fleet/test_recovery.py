"""What a device does with updates undone or interrupted: a manifest the desired state no longer
lists, a crash that leaves an uncommitted or half-recorded version, files damaged or left over in
the staging directory."""

from __future__ import annotations

import hashlib
import shutil
import threading
from pathlib import Path

import httpx
import pytest

from agent.fleet.state import FleetState, ModelState
from runtimes.examples.variants import mlp_version
from tests.agent.fleet.artifacts import Fault
from tests.agent.fleet.conftest import AgentFactory
from tests.agent.fleet.publisher import Fleet
from tests.agent.fleet.test_faults import _process_config, _ready
from tests.agent.fleet.test_updates import _states, served
from tests.agent.process import agent_process
from tests.agent.server import copy_models, wait_until
from tests.mqtt_broker import Mosquitto


@pytest.mark.slow
def test_an_update_the_desired_state_no_longer_lists_is_withdrawn(
    fleet: Fleet, fleet_agent: AgentFactory, tmp_path: Path
) -> None:
    payload = fleet.manifest("mlp", 2, 1, mlp_version(tmp_path / "v2", seed=2))
    hold = threading.Event()
    fleet.artifacts.faults[payload["artifacts"][0]["files"][0]["sha256"]] = Fault(hold=hold)
    with fleet_agent() as agent:
        fleet.publish_desired("dev-1", fleet.sign(payload))
        fleet.wait_event("dev-1", "downloading", sequence=1)
        fleet.publish_desired("dev-1")  # the rollout was rolled back: nothing asked for any more
        event = fleet.wait_event("dev-1", "rejected", sequence=1)
        assert event.code == "superseded" and "withdrawn" in (event.reason or ""), event
        hold.set()
        wait_until(lambda: not agent.state.fleet.updater.busy, what="the updater to settle")  # type: ignore[union-attr]
        assert served(agent)[0] == "1"
    assert "committed" not in _states(fleet, 1) and "active" not in _states(fleet, 1)


@pytest.mark.slow
def test_a_damaged_staged_file_is_downloaded_again(
    fleet: Fleet, fleet_agent: AgentFactory, example_repo: Path, tmp_path: Path
) -> None:
    payload = fleet.manifest("mlp", 2, 1, mlp_version(tmp_path / "v2", seed=2))
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    staging = repo / ".staging"
    staging.mkdir()
    for ref in payload["artifacts"][0]["files"]:
        (staging / f"{ref['sha256']}.blob").write_bytes(b"")  # renamed, never written: torn
    with fleet_agent(repo=repo) as agent:
        fleet.publish_desired("dev-1", fleet.sign(payload))
        fleet.wait_event("dev-1", "committed", sequence=1)
        assert served(agent)[0] == "2"


@pytest.mark.slow
def test_staging_files_no_update_needs_are_deleted(
    fleet: Fleet, fleet_agent: AgentFactory, example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    staging = repo / ".staging"
    staging.mkdir()
    orphan = hashlib.sha256(b"a manifest long superseded").hexdigest()
    (staging / f"{orphan}.part").write_bytes(b"half")
    (staging / f"{orphan}.blob").write_bytes(b"whole")
    with fleet_agent(repo=repo) as agent:
        fleet.publish_desired(
            "dev-1", fleet.sign(fleet.manifest("mlp", 2, 1, mlp_version(tmp_path / "v2", seed=2)))
        )
        fleet.wait_event("dev-1", "committed", sequence=1)
        wait_until(lambda: not list(staging.iterdir()), what="an empty staging directory")
        assert served(agent)[0] == "2"


@pytest.mark.slow
def test_a_pointer_ahead_of_the_state_after_a_crash_serves_the_committed_version(
    fleet: Fleet, fleet_agent: AgentFactory, example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    # the crash came after config.toml named version 2 and before fleet-state.json said so
    shutil.copytree(mlp_version(tmp_path / "v2", seed=2), repo / "mlp/2")
    (repo / "mlp/config.toml").write_text("[version_policy]\nspecific = [2]\n")
    state_dir = tmp_path / "state-dev-1"
    state_dir.mkdir()
    state = FleetState(models={"mlp": ModelState(committed_version=1, committed_sequence=1)})
    (state_dir / "fleet-state.json").write_text(state.model_dump_json())
    with fleet_agent(repo=repo) as agent:
        assert served(agent)[0] == "1"


@pytest.mark.slow
def test_a_new_model_uncommitted_at_a_crash_is_not_served_after_it(
    fleet: Fleet, broker: Mosquitto, example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    config = _process_config(tmp_path, fleet, broker, repo)
    other = mlp_version(tmp_path / "other", seed=4)
    fleet.publish_desired(
        "dev-k", fleet.sign(fleet.manifest("other", 1, 1, other, health={"window_s": 3600}))
    )
    with agent_process("--config", str(config)) as agent:
        fleet.wait_event("dev-k", "active", sequence=1)
        agent.proc.kill()
        agent.proc.wait(timeout=30)
    assert (repo / "other/1").is_dir()
    fleet.publish_desired("dev-k")  # withdrawn meanwhile: nothing brings it back
    with agent_process("--config", str(config)) as agent:
        wait_until(lambda: _ready(agent.address), what="readiness")
        assert httpx.get(f"{agent.address}/v2/models/other/ready").status_code != 200
        assert not (repo / "other/1").exists()
