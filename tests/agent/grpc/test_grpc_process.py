"""``edgefleet agent`` as a real process (uvloop, the CLI's settings) with gRPC on: it serves
on its Unix socket, and SIGTERM stops it cleanly and removes the socket."""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.agent.process import agent_process
from tests.agent.server import copy_models, wait_until


@pytest.mark.slow
def test_agent_process_serves_grpc_on_its_socket(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        sock = Path(short) / "grpc.sock"
        env = {
            "EDGEFLEET_AGENT_GRPC__ENABLED": "true",
            "EDGEFLEET_AGENT_GRPC__PORT": "",  # unset: the Unix socket only
            "EDGEFLEET_AGENT_GRPC__UDS": str(sock),
        }
        args = ("--model-repository", str(repo), "--port", "0")
        with agent_process(*args, env=env) as agent:
            wait_until(lambda: "grpc listening" in agent.log_messages(), what="gRPC to listen")
            assert sock.stat().st_mode & 0o777 == 0o660
            with grpcclient.InferenceServerClient(f"unix:{sock}") as client:
                wait_until(lambda: client.is_model_ready("mlp"), what="mlp to load")
                x = np.ones((2, 256), np.float32)
                tensor = grpcclient.InferInput("input", [2, 256], "FP32")
                tensor.set_data_from_numpy(x)
                assert client.infer("mlp", [tensor]).as_numpy("logits").shape == (2, 10)
            agent.proc.send_signal(signal.SIGTERM)
            assert agent.proc.wait(timeout=30) == 0
        assert not sock.exists()
