"""Python steps: run in a worker process with limits; a crash, a hang, an error or a memory
blow-up fails that request only, and the agent (and the step) go on serving."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.pipelines.python_steps import KEPT_ENVIRONMENT
from agent.pipelines.settings import PipelineSettings, PythonSteps
from agent.pipelines.version import python_refusal
from common.pipeline_config import parse_pipeline
from tests.agent.server import RunningAgent, copy_models, serve, wait_until

STEPS = """\
inputs = [{ name = "x", datatype = "FP32", shape = [-1, 256] }]
outputs = [
    { name = "own", datatype = "FP32", shape = [-1, 10] },
    { name = "named", datatype = "FP32", shape = [-1, 10] },
]

[[steps]]
name = "scale"
kind = "python"
file = "scale.py"
inputs = { x = "x" }
outputs = { y = "scaled" }
parameters = { factor = 2.0 }
timeout_s = 2.0

[[steps]]
name = "own"          # this version's model file
kind = "model"
inputs = { input = "scaled" }
outputs = { logits = "own" }

[[steps]]
name = "named"        # another served model: an ensemble
kind = "model"
model = "mlp"
inputs = { input = "scaled" }
outputs = { logits = "named" }
"""

# What the first value of the request asks the step to do.
SCALE_PY = """\
import os
import time

import numpy as np

factor = 1.0


def setup(parameters):
    global factor
    factor = float(parameters["factor"])


def process(inputs):
    x = inputs["x"]
    first = float(x[0, 0])
    print("a print goes to the agent's stderr, not into the answer")
    if first == 7:
        raise ValueError("row 0 starts with 7")
    if first == 13:
        os.abort()
    if first == 42:
        time.sleep(3600)
    if first == 99:
        np.ones(2**31)  # 16 GiB: past the worker's memory limit
    if first == 55:  # a child that leaves the process group, then a hang
        if os.fork() == 0:
            os.setsid()
            time.sleep(3600)
        time.sleep(3600)
    if first == 77:  # a fork bomb: every child hangs, the step forks until refused
        while True:
            if os.fork() == 0:
                time.sleep(3600)
    if first == 66:  # what the step can see of the agent: its environment, the network
        import socket
        try:
            socket.create_connection(("127.0.0.1", 9), timeout=2).close()
            reached = "connected"
        except OSError as exc:
            reached = str(exc.errno)
        raise ValueError(" ".join(sorted(os.environ)) + " | " + reached)
    return {"y": x * np.float32(factor)}
"""


TAIL_STEPS = """\
inputs = [{ name = "x", datatype = "FP32", shape = [-1, 256] }]
outputs = [{ name = "z", datatype = "FP32", shape = [-1, 10] }]

[[steps]]
name = "own"
kind = "model"
inputs = { input = "x" }
outputs = { logits = "logits" }

[[steps]]
name = "tail"
kind = "python"
file = "tail.py"
inputs = { x = "x", y = "logits" }
outputs = { z = "z" }
"""

# A step after the model whose output does not always have the shape the pipeline declares.
TAIL_PY = """\
def process(inputs):
    y = inputs["y"]
    return {"z": y[:, :7] if float(inputs["x"][0, 0]) == 88 else y}
"""


def _write(repo: Path, example_repo: Path) -> Path:
    copy_models(example_repo, repo, "mlp")
    version = repo / "scaled" / "1"
    version.mkdir(parents=True)
    shutil.copy(example_repo / "mlp/1/model.onnx", version / "model.onnx")
    (version / "pipeline.toml").write_text(STEPS)
    (version / "scale.py").write_text(SCALE_PY)
    tail = repo / "tail" / "1"
    tail.mkdir(parents=True)
    shutil.copy(example_repo / "mlp/1/model.onnx", tail / "model.onnx")
    (tail / "pipeline.toml").write_text(TAIL_STEPS)
    (tail / "tail.py").write_text(TAIL_PY)
    # the scale step with time to fork up to its bound: an agent run as root has the PID
    # namespace's pid_max (300) for bound, not RLIMIT_NPROC's, and a loaded host forks slowly
    bomb = repo / "bomb" / "1"
    bomb.mkdir(parents=True)
    shutil.copy(example_repo / "mlp/1/model.onnx", bomb / "model.onnx")
    (bomb / "pipeline.toml").write_text(STEPS.replace("timeout_s = 2.0", "timeout_s = 60.0"))
    (bomb / "scale.py").write_text(SCALE_PY)
    return version


MAX_PROCESSES = 16


@pytest.fixture(scope="module")
def repo(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = tmp_path_factory.mktemp("repo")
    _write(made, example_repo)
    return made


@pytest.fixture(scope="module")
def agent(repo: Path) -> Iterator[RunningAgent]:
    settings = {
        "python_steps": "any",
        "python_worker_memory_mb": 768,
        "python_worker_max_processes": MAX_PROCESSES,
    }
    with serve(repo, pipelines=settings) as running:
        yield running


def _tensor(x: np.ndarray) -> dict[str, object]:
    return {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}


def _call(agent: RunningAgent, first: float, model: str = "scaled") -> tuple[int, dict[str, Any]]:
    x = np.linspace(-1, 1, 2 * 256, dtype=np.float32).reshape(2, 256)
    x[0, 0] = first
    response = agent.client.post(f"/v2/models/{model}/infer", json={"inputs": [_tensor(x)]})
    return response.status_code, response.json()


def _serves(agent: RunningAgent) -> None:
    status, doc = _call(agent, 0.5)
    assert status == 200, doc
    x = np.linspace(-1, 1, 2 * 256, dtype=np.float32).reshape(2, 256)
    x[0, 0] = 0.5
    direct = agent.infer_json("mlp", 2 * x).json()["outputs"][0]["data"]
    outputs = {o["name"]: o["data"] for o in doc["outputs"]}
    np.testing.assert_allclose(outputs["own"], direct, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outputs["named"], direct, rtol=1e-5, atol=1e-5)


def test_python_step_then_own_and_named_model(agent: RunningAgent) -> None:
    _serves(agent)
    # Triton's config names the other model it calls as an ensemble step (perf_analyzer reads
    # it to find the composing models); its own model file and its Python step have none
    config = agent.client.get("/v2/models/scaled/config").json()
    assert config["platform"] == "ensemble"
    assert config["ensemble_scheduling"]["step"] == [
        {"model_name": "mlp", "model_version": -1, "input_map": {}, "output_map": {}}
    ]


def test_a_step_that_raises_is_a_422_with_its_message(agent: RunningAgent) -> None:
    status, doc = _call(agent, 7)
    assert status == 422
    assert doc["error"] == "step scale: ValueError: row 0 starts with 7"
    _serves(agent)


def test_a_crash_is_a_502_and_the_worker_is_replaced(agent: RunningAgent) -> None:
    status, doc = _call(agent, 13)
    assert status == 502
    # the worker dies by SIGABRT; under load its exit is sometimes seen as status 255 first
    assert "step scale: the worker of scale.py failed" in str(doc["error"])
    assert "killed by SIGABRT" in str(doc["error"]) or "exited with status" in str(doc["error"])
    _serves(agent)


@pytest.mark.slow
def test_a_hang_is_a_504_and_the_worker_is_replaced(agent: RunningAgent) -> None:
    status, doc = _call(agent, 42)
    assert status == 504
    assert "step scale: passed its timeout of 2 s; worker replaced" == doc["error"]
    _serves(agent)


def _workers_of(repo: Path, model: str = "scaled") -> list[int]:
    """Processes running this test's step file: its worker and whatever the worker forked."""
    step_file = str(repo / model / "1" / "scale.py").encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and step_file in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue  # gone meanwhile
    return found


NAMESPACES = subprocess.run(["unshare", "-Urnpf", "true"], capture_output=True).returncode == 0
"""Whether this host lets an unprivileged process make user, PID and network namespaces."""


@pytest.mark.slow
@pytest.mark.skipif(not NAMESPACES, reason="the host refuses user namespaces")
def test_a_child_that_calls_setsid_dies_with_its_worker(agent: RunningAgent, repo: Path) -> None:
    status, doc = _call(agent, 55)
    assert status == 504, doc
    wait_until(lambda: not _workers_of(repo), timeout_s=10, what="the step's processes to end")
    _serves(agent)


@pytest.mark.skipif(not NAMESPACES, reason="the host refuses user namespaces")
def test_a_fork_bomb_is_a_502_naming_the_limit_and_leaves_no_process(
    agent: RunningAgent, repo: Path
) -> None:
    status, doc = _call(agent, 77, "bomb")
    assert status == 502, doc
    assert doc["error"] == (
        "step scale: the worker of scale.py failed: it reached its limit of "
        f"{MAX_PROCESSES} processes (pipelines.python_worker_max_processes); it and all it "
        "started were killed"
    )
    wait_until(lambda: not _workers_of(repo, "bomb"), timeout_s=10, what="the bomb to end")
    assert _call(agent, 0.5, "bomb")[0] == 200  # a new worker
    _serves(agent)


def test_a_step_sees_none_of_the_agents_environment_nor_the_network(agent: RunningAgent) -> None:
    status, doc = _call(agent, 66)
    assert status == 422
    names, reached = str(doc["error"]).removeprefix("step scale: ValueError: ").split(" | ")
    assert set(names.split()) <= set(KEPT_ENVIRONMENT) | {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}
    assert "OMP_NUM_THREADS" in names.split()  # the list was read
    if NAMESPACES:
        assert reached == str(errno.ENETUNREACH)  # no interface up: not even loopback
    _serves(agent)


def test_an_output_of_another_shape_than_declared_is_a_422_naming_it(
    agent: RunningAgent,
) -> None:
    x = np.linspace(-1, 1, 2 * 256, dtype=np.float32).reshape(2, 256)
    assert agent.client.post("/v2/models/tail/infer", json={"inputs": [_tensor(x)]}).is_success
    x[0, 0] = 88
    response = agent.client.post("/v2/models/tail/infer", json={"inputs": [_tensor(x)]})
    assert response.status_code == 422
    assert response.json()["error"] == (
        "output 'z' is FP32 [2, 7], the pipeline declares FP32 [-1, 10]"
    )


def test_memory_past_the_workers_limit_fails_the_request(agent: RunningAgent) -> None:
    status, doc = _call(agent, 99)
    assert status == 422
    assert "MemoryError" in str(doc["error"])
    _serves(agent)


def test_python_steps_are_off_by_default(example_repo: Path, tmp_path: Path) -> None:
    _write(tmp_path, example_repo)
    with serve(tmp_path) as agent:
        rows = {r["name"]: r for r in agent.client.post("/v2/repository/index").json()}
        assert rows["scaled"]["state"] == "UNAVAILABLE"
        assert "pipelines.python_steps is off" in rows["scaled"]["reason"]
        assert agent.infer_json("mlp", np.zeros((1, 256))).status_code == 200


def test_verified_means_installed_by_the_fleet_and_unchanged(
    example_repo: Path, tmp_path: Path
) -> None:
    version = _write(tmp_path, example_repo)
    steps = parse_pipeline(STEPS, "pipeline.toml")
    verified = PipelineSettings(python_steps=PythonSteps.VERIFIED)
    assert python_refusal(steps, version, verified, verified=True) is None  # staged by the fleet
    assert "verified manifest" in str(python_refusal(steps, version, verified, verified=False))
    digests = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in version.iterdir()
    }  # what the fleet store writes at an install
    (version / ".digests.json").write_text(json.dumps(digests))
    assert python_refusal(steps, version, verified, verified=False) is None
    (version / "scale.py").write_text(SCALE_PY + "\nimport os; os.system('true')\n")
    assert python_refusal(steps, version, verified, verified=False) is not None
    off = PipelineSettings()
    assert python_refusal(steps, version, off, verified=True) == "pipelines.python_steps is off"
