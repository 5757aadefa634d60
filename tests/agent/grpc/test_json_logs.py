"""Every line ``edgefleet agent`` writes is one JSON object with gRPC on and a Python step that
forks, prints and crashes: gRPC core's own lines (its ``fork_posix.cc`` notice at each fork
while its threads run) are silenced at their source, and the step's prints are logged."""

from __future__ import annotations

import shutil
import signal
import tempfile
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from agent.grpc.core_environment import core_environment
from agent.settings import GrpcSettings
from tests.agent.process import agent_process
from tests.agent.server import copy_models, wait_until

PIPELINE = """\
inputs = [{ name = "x", datatype = "FP32", shape = [-1, 256] }]
outputs = [{ name = "y", datatype = "FP32", shape = [-1, 10] }]

[[steps]]
name = "fork"
kind = "python"
file = "fork.py"
inputs = { x = "x" }
outputs = { x = "forked" }

[[steps]]
name = "own"
kind = "model"
inputs = { input = "forked" }
outputs = { logits = "y" }
"""

FORK_PY = """\
import os


def process(inputs):
    x = inputs["x"]
    print("the step prints", x.shape)
    if float(x[0, 0]) == 13:
        os.abort()
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    return {"x": x}
"""


def _infer(client: grpcclient.InferenceServerClient, first: float) -> np.ndarray:
    x = np.zeros((1, 256), np.float32)
    x[0, 0] = first
    tensor = grpcclient.InferInput("x", [1, 256], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("forks", [tensor]).as_numpy("y")
    assert result is not None
    return result


@pytest.mark.slow
def test_every_line_is_json_with_grpc_on_and_a_forking_step(
    example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    version = repo / "forks" / "1"
    version.mkdir(parents=True)
    shutil.copy(example_repo / "mlp/1/model.onnx", version / "model.onnx")
    (version / "pipeline.toml").write_text(PIPELINE)
    (version / "fork.py").write_text(FORK_PY)
    env = {"EDGEFLEET_AGENT_PIPELINES__PYTHON_STEPS": "any"}
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        sock = Path(short) / "grpc.sock"
        args = ("--model-repository", str(repo), "--port", "0", "--grpc-uds", str(sock))
        with agent_process(*args, "--grpc-port", "0", env=env) as agent:
            wait_until(lambda: "grpc listening" in agent.log_messages(), what="gRPC to listen")
            with grpcclient.InferenceServerClient(f"unix:{sock}") as client:
                wait_until(lambda: client.is_model_ready("forks"), what="forks to load")
                assert _infer(client, 0.5).shape == (1, 10)
                with pytest.raises(InferenceServerException, match="killed by SIGABRT"):
                    _infer(client, 13)  # the worker dies: the next call forks a new one
                assert _infer(client, 0.5).shape == (1, 10)  # forked with gRPC running
                with httpx.Client(base_url=agent.address) as rest:
                    bad = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}
                    assert rest.post("/v2/models/forks/infer", json=bad).status_code == 400
            agent.proc.send_signal(signal.SIGTERM)
            assert agent.proc.wait(timeout=30) == 0
    assert agent.not_json == []
    printed = [r for r in agent.logs if str(r.get("message", "")).startswith("the step prints")]
    assert printed and all(r.get("step") == "fork" for r in printed), agent.logs
    assert "python step worker replaced" in agent.log_messages()


def test_grpc_cores_variables_come_from_the_settings() -> None:
    assert core_environment(GrpcSettings()) == {
        "GRPC_VERBOSITY": "NONE",
        "GRPC_ENABLE_FORK_SUPPORT": "false",
    }
    assert core_environment(GrpcSettings(core_log="debug"))["GRPC_VERBOSITY"] == "DEBUG"
    with pytest.raises(ValueError, match="core_log"):
        GrpcSettings(core_log="loud")
