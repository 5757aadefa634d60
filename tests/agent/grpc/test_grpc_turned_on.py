"""gRPC turned on as a new user does, from docs/local-apps.md: the ``[grpc]`` TOML pasted as
written (only the port and the socket's directory swapped for the test's: a directory that does
not exist yet, as /run/edgefleet on a fresh machine; it once made the agent abort with SIGABRT),
and the command-line flags. Real agent processes, unmodified tritonclient."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.agent.grpc.conftest import free_port
from tests.agent.process import agent_process
from tests.agent.server import copy_models, wait_until

DOC = Path(__file__).parents[3] / "docs" / "local-apps.md"
EXE = Path(sys.executable).parent / "edgefleet"


def _infers(address: str) -> bool:
    with grpcclient.InferenceServerClient(address) as client:
        wait_until(lambda: client.is_model_ready("mlp"), what="mlp to load")
        tensor = grpcclient.InferInput("input", [1, 256], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 256), np.float32))
        return client.infer("mlp", [tensor]).as_numpy("logits").shape == (1, 10)


@pytest.mark.slow
def test_the_docs_toml_starts_grpc_in_a_directory_not_made_yet(
    example_repo: Path, tmp_path: Path
) -> None:
    (toml,) = re.findall(r"```toml\n(.*?)```", DOC.read_text(), flags=re.S)
    assert 'uds = "/run/edgefleet/grpc.sock"' in toml and "port = 8001" in toml
    port = free_port()
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        sock = Path(short) / "run-edgefleet" / "grpc.sock"
        config = tmp_path / "agent.toml"
        config.write_text(
            toml.replace("/run/edgefleet/grpc.sock", str(sock)).replace("8001", str(port))
        )
        repo = copy_models(example_repo, tmp_path / "repo", "mlp")
        args = ("--config", str(config), "--model-repository", str(repo), "--port", "0")
        with agent_process(*args) as agent:
            wait_until(lambda: "grpc listening" in agent.log_messages(), what="gRPC to listen")
            assert sock.parent.stat().st_mode & 0o777 == 0o750
            assert _infers(f"unix:{sock}") and _infers(f"127.0.0.1:{port}")


@pytest.mark.slow
def test_the_flags_turn_grpc_on_and_off(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        sock = Path(short) / "new" / "grpc.sock"
        port = free_port()
        args = ("--model-repository", str(repo), "--port", "0")
        with agent_process(*args, "--grpc-port", str(port), "--grpc-uds", str(sock)) as agent:
            wait_until(lambda: "grpc listening" in agent.log_messages(), what="gRPC to listen")
            assert _infers(f"unix:{sock}") and _infers(f"127.0.0.1:{port}")
        env = {"EDGEFLEET_AGENT_GRPC__ENABLED": "true", "EDGEFLEET_AGENT_GRPC__PORT": str(port)}
        with agent_process(*args, "--no-grpc", env=env) as agent:
            wait_until(lambda: agent.address != "", what="REST to listen")
            assert "grpc listening" not in agent.log_messages()


def test_a_socket_directory_the_agent_cannot_make_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    run = subprocess.run(
        [str(EXE), "agent", "--model-repository", str(tmp_path), "--grpc-uds", f"{blocker}/g.sock"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: grpc.uds: cannot make the directory of socket"), last
