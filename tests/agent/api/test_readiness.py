"""What Ready means (docs/agent.md "Readiness"), on real agents: in a thread, with a real
Mosquitto where the fleet client is on, and as an ``edgefleet agent`` process.

- An agent that follows a fleet is Ready with an empty store, with or without its broker,
  and stays Ready while the fleet installs models, whether they load or not; per-model
  readiness says which models serve. Models loaded from its repository still count.
- A local-only agent refuses a model repository that does not exist, in one line naming the
  path and the setting; an empty one is served (Ready, as Triton is) with a warning.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from runtimes.examples.variants import mlp_version
from tests.agent.fleet.artifacts import artifact_server
from tests.agent.fleet.conftest import fleet_settings
from tests.agent.fleet.publisher import Fleet
from tests.agent.process import agent_process
from tests.agent.server import RunningAgent, copy_models, serve, wait_until
from tests.mqtt_broker import Mosquitto, free_port

EDGEFLEET = str(Path(sys.executable).parent / "edgefleet")


@dataclass
class FleetRig:
    fleet: Fleet
    broker: Mosquitto


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[FleetRig]:
    broker = Mosquitto(tmp_path / "broker").start()
    try:
        with artifact_server(tmp_path / "artifacts") as artifacts:
            fleet = Fleet(broker.url, artifacts)
            try:
                yield FleetRig(fleet, broker)
            finally:
                fleet.close()
    finally:
        broker.stop()


def _status(agent: RunningAgent, path: str) -> int:
    return agent.client.get(path).status_code


def _empty(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


# -- an agent that follows a fleet ---------------------------------------------------------


def test_a_fleet_agent_with_an_empty_store_is_ready_and_stays_ready_while_it_installs(
    rig: FleetRig, tmp_path: Path
) -> None:
    fleet = rig.fleet
    settings = fleet_settings(fleet, rig.broker, tmp_path / "state")
    with serve(_empty(tmp_path / "repo"), fleet=settings) as agent:
        resp = agent.client.get("/v2/health/ready")
        assert (resp.status_code, resp.json()) == (200, {"ready": True})
        assert _status(agent, "/v2/models/mlp/ready") == 404  # unknown here, not failed

        # a model new to the device, then one that cannot load: the device stays Ready and
        # per-model readiness tells the two apart
        good = fleet.sign(fleet.manifest("mlp", 1, 1, mlp_version(tmp_path / "v1", seed=3)))
        fleet.publish_desired("dev-1", good)
        fleet.wait_event("dev-1", "committed", sequence=1)
        assert _status(agent, "/v2/models/mlp/ready") == 200
        assert _status(agent, "/v2/health/ready") == 200

        broken_dir = mlp_version(tmp_path / "broken", seed=4)
        (broken_dir / "model.onnx").write_bytes(b"not a model")
        broken = fleet.sign(fleet.manifest("other", 1, 2, broken_dir))
        fleet.publish_desired("dev-1", good, broken)
        event = fleet.wait_event("dev-1", "rejected", sequence=2)
        assert event.code == "load_failed", event
        assert _status(agent, "/v2/models/other/ready") == 503
        assert _status(agent, "/v2/models/mlp/ready") == 200
        assert _status(agent, "/v2/health/ready") == 200


def test_a_fleet_agent_is_ready_without_its_broker_and_creates_a_missing_repository(
    rig: FleetRig, tmp_path: Path
) -> None:
    # nothing listens on the port: the agent keeps trying, and serves meanwhile
    settings = fleet_settings(
        rig.fleet, rig.broker, tmp_path / "state", mqtt_url=f"mqtt://127.0.0.1:{free_port()}"
    )
    repo = tmp_path / "not-yet" / "models"
    with serve(repo, fleet=settings) as agent:
        assert agent.state.fleet is not None and not agent.state.fleet.connected.is_set()
        assert _status(agent, "/v2/health/ready") == 200
        assert _status(agent, "/v2/models/mlp/ready") == 404
    assert repo.is_dir()


def test_a_fleet_agent_still_counts_the_models_of_its_repository(
    rig: FleetRig, example_repo: Path, tmp_path: Path
) -> None:
    # what it loaded from its store at start-up is strict readiness's, as on any agent
    repo = copy_models(example_repo, tmp_path / "repo", "mlp", "cnn")
    (repo / "cnn/1/model.onnx").write_bytes(b"not a model")
    settings = fleet_settings(rig.fleet, rig.broker, tmp_path / "state")
    with serve(repo, fleet=settings) as agent:
        assert _status(agent, "/v2/models/mlp/ready") == 200
        assert _status(agent, "/v2/models/cnn/ready") == 503
        assert _status(agent, "/v2/health/ready") == 503
    with serve(repo, fleet=settings, strict_readiness=False) as agent:
        assert _status(agent, "/v2/health/ready") == 200


# -- a local-only agent --------------------------------------------------------------------


def _run_agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EDGEFLEET_")}
    return subprocess.run(
        [EDGEFLEET, "agent", "--port", "0", *args],
        env={**environment, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_a_missing_repository_stops_a_local_agent_with_one_line(how: str, tmp_path: Path) -> None:
    missing = tmp_path / "modles"  # a typo
    if how == "flag":
        done = _run_agent("--model-repository", str(missing))
    else:
        done = _run_agent(env={"EDGEFLEET_AGENT_MODEL_REPOSITORY": str(missing)})
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"Error: model repository {missing} does not exist"), line
    assert "--model-repository DIR" in line and "EDGEFLEET_AGENT_MODEL_REPOSITORY" in line
    assert not missing.exists()


def test_a_repository_that_is_a_file_stops_a_local_agent_with_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "models.tar"
    a_file.write_bytes(b"")
    # from the environment: the flag's own check (click) refuses a file before the agent runs
    done = _run_agent(env={"EDGEFLEET_AGENT_MODEL_REPOSITORY": str(a_file)})
    assert done.returncode != 0 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"model repository {a_file} is not a directory" in line, line


def test_an_empty_repository_is_served_ready_with_a_warning(tmp_path: Path) -> None:
    repo = _empty(tmp_path / "repo")
    (repo / "README").write_text("models go here\n")  # a file is not a model
    with agent_process("--model-repository", str(repo), "--port", "0") as agent:
        wait_until(
            lambda: "start-up load finished" in agent.log_messages(), what="the start-up load"
        )
        (warning,) = [r for r in agent.logs if r.get("level") == "WARNING"]
        assert "model repository is empty" in str(warning["message"]), warning
        assert warning["repository"] == str(repo)
        with httpx.Client(base_url=agent.address) as client:
            assert client.get("/v2/health/ready").status_code == 200
            assert client.get("/v2/models/mlp/ready").status_code == 404


@pytest.mark.parametrize("strict", [True, False])
def test_an_empty_repository_is_ready_in_both_readiness_modes(strict: bool, tmp_path: Path) -> None:
    with serve(_empty(tmp_path / "repo"), strict_readiness=strict) as agent:
        assert _status(agent, "/v2/health/ready") == 200
        assert _status(agent, "/v2/models/mlp/ready") == 404


def test_a_model_loaded_into_an_empty_repository_then_counts(
    example_repo: Path, tmp_path: Path
) -> None:
    repo = _empty(tmp_path / "repo")
    with serve(repo) as agent:
        assert _status(agent, "/v2/health/ready") == 200
        copy_models(example_repo, repo, "mlp")
        (repo / "mlp/1/model.onnx").write_bytes(b"not a model")
        assert agent.client.post("/v2/repository/models/mlp/load").status_code == 400
        assert _status(agent, "/v2/health/ready") == 503  # loaded from the repository: failed
        assert agent.client.post("/v2/repository/models/mlp/unload").status_code == 200
        assert _status(agent, "/v2/health/ready") == 200
