"""A local app shrinks its shared memory object while requests use it: the agent (a real
process) answers those requests with the reason and keeps serving. Through a mapping, one read
past the object's new end killed the whole agent with SIGBUS after 1-10 answers."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.agent.process import agent_process
from tests.agent.server import copy_models, wait_until

SIZE = 4096
SHRINKER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    os.ftruncate(fd, 0)
    os.ftruncate(fd, int(sys.argv[3]))
"""


def _client_loop(address: str, stop: threading.Event, answers: list[str]) -> None:
    client = httpclient.InferenceServerClient(address)
    tensor = httpclient.InferInput("input", [1, 256], "FP32")
    tensor.set_shared_memory("in", 1024)
    output = httpclient.InferRequestedOutput("logits")
    output.set_shared_memory("out", 64)
    try:
        while not stop.is_set():
            try:
                client.infer("mlp", [tensor], outputs=[output])
                answers.append("ok")
            except InferenceServerException as exc:
                answers.append(f"{exc.status()} {exc.message()}")
    finally:
        client.close()


@pytest.mark.slow
def test_a_shrinking_region_is_refused_and_the_agent_keeps_serving(
    example_repo: Path, tmp_path: Path
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    key = f"/edgefleet-shrink-{uuid.uuid4().hex[:10]}"
    handle = shm.create_shared_memory_region("app", key, SIZE)
    shm.set_shared_memory_region(handle, [np.full((1, 256), 0.5, np.float32)])
    try:
        with agent_process("--model-repository", str(repo), "--port", "0") as agent:
            address = agent.address.removeprefix("http://")
            setup = httpclient.InferenceServerClient(address)
            wait_until(lambda: setup.is_model_ready("mlp"), what="mlp to be ready")
            setup.register_system_shared_memory("in", key, 1024)
            setup.register_system_shared_memory("out", key, 64, offset=2048)
            shrinker = subprocess.Popen(
                [sys.executable, "-c", SHRINKER, f"/dev/shm{key}", "4", str(SIZE)]
            )
            stop, answers = threading.Event(), []
            clients = [
                threading.Thread(target=_client_loop, args=(address, stop, answers))
                for _ in range(6)
            ]
            for c in clients:
                c.start()
            shrinker.wait(timeout=30)
            stop.set()
            for c in clients:
                c.join(timeout=30)
            assert agent.proc.poll() is None, f"the agent died: {agent.proc.returncode}"
            refused = [a for a in answers if a != "ok"]
            assert refused, "no request met a shrunk object: the race was not run"
            # each refusal is the documented one: a 400 that says why
            assert all(a.startswith("400 ") and "was shrunk" in a for a in refused), refused[:5]
            # the object whole again, the same regions serve, and so do the agent's others
            shm.set_shared_memory_region(handle, [np.full((1, 256), 0.5, np.float32)])
            tensor = httpclient.InferInput("input", [1, 256], "FP32")
            tensor.set_shared_memory("in", 1024)
            output = httpclient.InferRequestedOutput("logits")
            output.set_shared_memory("out", 64)
            result = setup.infer("mlp", [tensor], outputs=[output])
            assert result.get_output("logits") == {
                "name": "logits",
                "datatype": "FP32",
                "shape": [1, 10],
            }
            plain = httpclient.InferInput("input", [1, 256], "FP32")
            plain.set_data_from_numpy(np.full((1, 256), 0.5, np.float32))
            answered = setup.infer("mlp", [plain]).as_numpy("logits")
            in_region = shm.get_contents_as_numpy(handle, np.float32, [1, 10], offset=2048)
            np.testing.assert_allclose(in_region, answered, rtol=1e-5)
            setup.unregister_system_shared_memory()
            setup.close()
    finally:
        shm.destroy_shared_memory_region(handle)
