"""System shared memory over REST infer requests: tritonclient.http with
tritonclient.utils.shared_memory, unmodified, against a real agent; outputs equal to ONNX
Runtime's own on the example models."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from agent.shm.answers import hold_until_answered
from agent.shm.regions import RegionGoneError, SharedMemoryError, SharedMemoryRegistry
from agent.shm.settings import SharedMemorySettings
from tests.agent.fakes import Gate, gated_factory
from tests.agent.grpc.test_grpc_endpoints import golden_input, ort_outputs
from tests.agent.server import RunningAgent, copy_models, serve


@pytest.fixture(scope="module")
def agent(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = copy_models(example_repo, tmp_path_factory.mktemp("repo"), "mlp", "cnn")
    with serve(repo) as running:
        yield running


@pytest.fixture
def client(agent: RunningAgent) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(agent.url.removeprefix("http://"))
    yield c
    c.unregister_system_shared_memory()
    c.close()


class Regions:
    """Regions made by tritonclient's helpers, destroyed after the test."""

    def __init__(self) -> None:
        self.handles: list[object] = []

    def make(self, name: str, byte_size: int) -> tuple[object, str]:
        key = f"/edgefleet-http-{uuid.uuid4().hex[:12]}"
        self.handles.append(shm.create_shared_memory_region(name, key, byte_size))
        return self.handles[-1], key


@pytest.fixture
def regions() -> Iterator[Regions]:
    made = Regions()
    yield made
    for handle in made.handles:
        shm.destroy_shared_memory_region(handle)


def shm_request(
    x: np.ndarray, in_bytes: int, out_bytes: int, offset: int = 0
) -> tuple[list[httpclient.InferInput], list[httpclient.InferRequestedOutput]]:
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_shared_memory("in", in_bytes, offset=offset)
    output = httpclient.InferRequestedOutput("logits")
    output.set_shared_memory("out", out_bytes)
    return [tensor], [output]


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_inputs_and_outputs_in_regions_equal_onnx_runtime(
    client: httpclient.InferenceServerClient, regions: Regions, example_repo: Path, model: str
) -> None:
    assert "system_shared_memory" in client.get_server_metadata()["extensions"]
    x = golden_input(example_repo, model)
    expected = ort_outputs(example_repo, model, x)
    in_handle, in_key = regions.make("in", x.nbytes)
    out_handle, out_key = regions.make("out", expected.nbytes + 64)
    shm.set_shared_memory_region(in_handle, [x])
    client.register_system_shared_memory("in", in_key, x.nbytes)
    client.register_system_shared_memory("out", out_key, expected.nbytes + 64)
    inputs, outputs = shm_request(x, x.nbytes, expected.nbytes + 64)
    result = client.infer(model, inputs, outputs=outputs)
    got = shm.get_contents_as_numpy(out_handle, np.float32, list(expected.shape))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # as Triton answers: the output's metadata, no data and no parameters (Triton's C++
    # client reads binary_data_size wherever parameters appear)
    assert result.get_response()["outputs"] == [
        {"name": "logits", "datatype": "FP32", "shape": list(expected.shape)}
    ]
    # an input in a region with the output in the answer, at an offset in a bigger region
    _, big_key = regions.make("big", x.nbytes + 256)
    client.register_system_shared_memory("big", big_key, x.nbytes + 256)
    shm.set_shared_memory_region(regions.handles[-1], [x], offset=256)
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_shared_memory("big", x.nbytes, offset=256)
    plain = client.infer(model, [tensor])
    np.testing.assert_allclose(plain.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("region", "in_bytes", "offset", "field", "words"),
    [
        ("nope", 4096, 0, "inputs[0].parameters.shared_memory_region", "no shared memory region"),
        ("in", 4096, 16, "inputs[0].parameters.shared_memory_byte_size", "outside region"),
        ("in", 4100, 0, "inputs[0].parameters.shared_memory_byte_size", "byte size mismatch"),
    ],
)
def test_bad_region_use_is_a_400_naming_the_field(
    agent: RunningAgent,
    client: httpclient.InferenceServerClient,
    regions: Regions,
    region: str,
    in_bytes: int,
    offset: int,
    field: str,
    words: str,
) -> None:
    x = np.zeros((4, 256), np.float32)
    _, key = regions.make("in", x.nbytes + 8)
    client.register_system_shared_memory("in", key, x.nbytes + 8)
    params = {"shared_memory_region": region, "shared_memory_byte_size": in_bytes}
    if offset:
        params["shared_memory_offset"] = offset
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "parameters": params}
    response = agent.client.post("/v2/models/mlp/infer", json={"inputs": [tensor]})
    assert response.status_code == 400
    assert response.json()["error"].startswith(field)
    assert words in response.json()["error"]
    # tritonclient hears it too, and an output's region is checked before the request runs
    inputs, outputs = shm_request(x, x.nbytes, 40, offset=0)
    outputs[0].set_shared_memory("gone", 40)
    with pytest.raises(InferenceServerException, match=r"outputs\[0\].*no shared memory region"):
        client.infer("mlp", inputs, outputs=outputs)


def test_region_with_data_or_a_bad_size_is_refused(agent: RunningAgent) -> None:
    tensor = {"name": "input", "shape": [1, 256], "datatype": "FP32"}
    cases = [
        ({"shared_memory_region": "in"}, "shared_memory_byte_size: is required"),
        (
            {"shared_memory_region": "in", "shared_memory_byte_size": -1},
            "shared_memory_byte_size: must be a non-negative integer",
        ),
        (
            {"shared_memory_region": "in", "shared_memory_byte_size": 8, "binary_data_size": 8},
            "inputs[0].data: give data or a shared memory region",
        ),
    ]
    for params, words in cases:
        body = {"inputs": [{**tensor, "parameters": params}]}
        response = agent.client.post("/v2/models/mlp/infer", json=body)
        assert response.status_code == 400, response.text
        assert words in response.json()["error"]


def test_unregistered_while_in_use_fails_that_request(
    example_repo: Path, tmp_path: Path, regions: Regions
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    gate = Gate(closed=False)
    x = golden_input(example_repo, "mlp")
    out_bytes = x.shape[0] * 40
    with serve(repo, runtime_factory=gated_factory(gate)) as running:
        c = httpclient.InferenceServerClient(running.url.removeprefix("http://"))
        in_handle, in_key = regions.make("in", x.nbytes)
        out_handle, out_key = regions.make("out", out_bytes)
        shm.set_shared_memory_region(in_handle, [x])
        c.register_system_shared_memory("in", in_key, x.nbytes)
        c.register_system_shared_memory("out", out_key, out_bytes)
        gate.close()
        failures: list[BaseException] = []

        def call() -> None:
            # a client of its own: geventhttpclient's belong to the thread that made them
            caller = httpclient.InferenceServerClient(running.url.removeprefix("http://"))
            try:
                inputs, outputs = shm_request(x, x.nbytes, out_bytes)
                caller.infer("mlp", inputs, outputs=outputs)
            except BaseException as exc:
                failures.append(exc)
            finally:
                caller.close()

        caller = threading.Thread(target=call)
        caller.start()
        gate.wait_entered()  # the request's batch is in the runtime, reading "in"
        c.unregister_system_shared_memory()
        gate.open()
        caller.join(timeout=30)
        assert len(failures) == 1
        error = failures[0]
        assert isinstance(error, InferenceServerException)
        assert error.status() == "400"
        assert "was unregistered while the request used it" in str(error.message())
        # nothing was written, and the agent goes on serving
        assert not shm.get_contents_as_numpy(out_handle, np.uint8, [out_bytes]).any()
        tensor = httpclient.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        assert c.infer("mlp", [tensor]).as_numpy("logits").shape == (x.shape[0], 10)
        c.close()


def test_a_lease_is_released_however_the_answer_ends(regions: Regions) -> None:
    """The fast path may drop an answer (its client gone) without reading it: the regions
    the request held are let go all the same, and a region unregistered meanwhile fails it."""
    _, key = regions.make("r", 64)
    registry = SharedMemoryRegistry(SharedMemorySettings())
    region = registry.register("r", key, 0, 64)
    written: list[int] = []

    async def run(end: str) -> BaseException | int:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[int] = loop.create_future()
        lease = registry.lease()
        lease.take("r", "inputs[0]")
        held = hold_until_answered(answer, lease, written.append)
        assert region.leases == 1
        if end == "dropped":
            held.cancel()
        elif end == "unregistered":
            registry.unregister("r")
            answer.set_result(7)
        else:
            answer.set_result(7)
        try:
            return await held
        except (asyncio.CancelledError, SharedMemoryError) as exc:
            return exc
        finally:
            await asyncio.sleep(0)  # the answer's callbacks run
            assert answer.done() and region.leases == 0

    assert asyncio.run(run("answered")) == 7 and written == [7]
    assert isinstance(asyncio.run(run("dropped")), asyncio.CancelledError)
    assert written == [7]  # nothing written for a dropped request
    gone = asyncio.run(run("unregistered"))
    assert isinstance(gone, RegionGoneError)
    assert registry.status(None) == []


def test_cuda_shared_memory_is_answered_as_a_triton_without_a_gpu(
    client: httpclient.InferenceServerClient,
) -> None:
    """What perf_analyzer's shared-memory runs call at their end: an empty status and an
    unregister that succeeds; a register is refused with the reason, not a 404."""
    assert client.get_cuda_shared_memory_status() == []
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("frames")
    with pytest.raises(InferenceServerException) as refused:
        client.register_cuda_shared_memory("frames", b"handle", 0, 64)
    assert "CUDA shared memory is not supported" in str(refused.value)
    assert "system shared memory" in str(refused.value)
