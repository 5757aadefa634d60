"""System shared memory end to end: regions made and read by tritonclient.utils.shared_memory,
registered over gRPC or REST, inputs read from and outputs written into them by a real agent."""

from __future__ import annotations

import base64
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.agent.fakes import Gate, gated_factory
from tests.agent.grpc.conftest import GrpcAgent, grpc_settings
from tests.agent.grpc.test_grpc_endpoints import golden_input, ort_outputs
from tests.agent.server import copy_models, serve


class Regions:
    """Regions made by tritonclient's helpers, destroyed after the test."""

    def __init__(self) -> None:
        self.handles: list[object] = []

    def make(self, name: str, byte_size: int) -> tuple[object, str]:
        key = f"/edgefleet-test-{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(name, key, byte_size)
        self.handles.append(handle)
        return handle, key

    def destroy(self) -> None:
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions() -> Iterator[Regions]:
    made = Regions()
    yield made
    made.destroy()


def shm_request(
    x: np.ndarray, out_bytes: int
) -> tuple[list[grpcclient.InferInput], list[grpcclient.InferRequestedOutput]]:
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_shared_memory("in", x.nbytes)
    output = grpcclient.InferRequestedOutput("logits")
    output.set_shared_memory("out", out_bytes)
    return [tensor], [output]


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_grpc_shared_memory_in_and_out_equals_onnx_runtime(
    grpc_agent: GrpcAgent,
    client: grpcclient.InferenceServerClient,
    regions: Regions,
    example_repo: Path,
    model: str,
) -> None:
    x = golden_input(example_repo, model)
    expected = ort_outputs(example_repo, model, x)
    in_handle, in_key = regions.make("in", x.nbytes)
    out_handle, out_key = regions.make("out", expected.nbytes)
    shm.set_shared_memory_region(in_handle, [x])
    client.register_system_shared_memory("in", in_key, x.nbytes)
    client.register_system_shared_memory("out", out_key, expected.nbytes)
    try:
        status = client.get_system_shared_memory_status(as_json=True)["regions"]
        assert status["in"] == {"name": "in", "key": in_key, "byte_size": str(x.nbytes)}
        inputs, outputs = shm_request(x, expected.nbytes)
        result = client.infer(model, inputs, outputs=outputs)
        # in the region, not the answer: its entry empty, one per output as Triton writes
        assert list(result.get_response().raw_output_contents) == [b""]
        got = shm.get_contents_as_numpy(out_handle, np.float32, list(expected.shape))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        params = result.get_output("logits").parameters
        assert params["shared_memory_region"].string_param == "out"
    finally:
        client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status(as_json=True) == {}


def test_regions_registered_over_rest_serve_grpc(
    grpc_agent: GrpcAgent,
    client: grpcclient.InferenceServerClient,
    regions: Regions,
    example_repo: Path,
) -> None:
    x = golden_input(example_repo, "mlp")
    handle, key = regions.make("in", x.nbytes)
    shm.set_shared_memory_region(handle, [x])
    rest = httpclient.InferenceServerClient(grpc_agent.rest.url.removeprefix("http://"))
    try:
        rest.register_system_shared_memory("in", key, x.nbytes)
        assert rest.get_system_shared_memory_status() == [
            {"name": "in", "key": key, "offset": 0, "byte_size": x.nbytes}
        ]
        tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
        tensor.set_shared_memory("in", x.nbytes)
        result = client.infer("mlp", [tensor])  # the output comes back in the answer
        expected = ort_outputs(example_repo, "mlp", x)
        np.testing.assert_allclose(result.as_numpy("logits"), expected, atol=1e-5)
        with pytest.raises(InferenceServerException, match="already registered"):
            rest.register_system_shared_memory("in", key, x.nbytes)
        with pytest.raises(InferenceServerException, match="not a POSIX shared memory name"):
            rest.register_system_shared_memory("evil", "/../etc/passwd", 8)
        rest.unregister_system_shared_memory("in")
        assert rest.get_system_shared_memory_status() == []
    finally:
        rest.unregister_system_shared_memory()
        rest.close()


@pytest.mark.parametrize(
    ("in_bytes", "offset", "words"),
    [
        (1024 * 4 + 4, 0, "byte size mismatch"),  # more than the tensor
        (1024 * 4, 16, "outside region"),  # past the region's end
    ],
)
def test_tensor_ranges_are_checked(
    client: grpcclient.InferenceServerClient,
    regions: Regions,
    in_bytes: int,
    offset: int,
    words: str,
) -> None:
    x = np.zeros((4, 256), np.float32)
    _, key = regions.make("in", x.nbytes + 8)
    client.register_system_shared_memory("in", key, x.nbytes + 8)
    try:
        tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
        tensor.set_shared_memory("in", in_bytes, offset=offset)
        with pytest.raises(InferenceServerException) as info:
            client.infer("mlp", [tensor])
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert words in str(info.value.message())
        tensor.set_shared_memory("nope", x.nbytes)
        with pytest.raises(InferenceServerException, match="no shared memory region 'nope'"):
            client.infer("mlp", [tensor])
    finally:
        client.unregister_system_shared_memory("in")


def test_unregistered_while_in_use_fails_that_request(
    example_repo: Path, tmp_path: Path, regions: Regions
) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    gate = Gate(closed=False)
    x = golden_input(example_repo, "mlp")
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        config = grpc_settings(Path(short) / "a.sock")
        with serve(repo, grpc=config, runtime_factory=gated_factory(gate)):
            address = f"127.0.0.1:{config['port']}"
            with grpcclient.InferenceServerClient(address) as c:
                in_handle, in_key = regions.make("in", x.nbytes)
                _, out_key = regions.make("out", x.shape[0] * 40)
                shm.set_shared_memory_region(in_handle, [x])
                c.register_system_shared_memory("in", in_key, x.nbytes)
                c.register_system_shared_memory("out", out_key, x.shape[0] * 40)
                gate.close()
                failures: list[BaseException] = []

                def call() -> None:
                    try:
                        inputs, outputs = shm_request(x, x.shape[0] * 40)
                        c.infer("mlp", inputs, outputs=outputs)
                    except BaseException as exc:
                        failures.append(exc)

                caller = threading.Thread(target=call)
                caller.start()
                gate.wait_entered()  # the request's batch is in the runtime, reading "in"
                c.unregister_system_shared_memory()
                gate.open()
                caller.join(timeout=30)
                assert len(failures) == 1
                error = failures[0]
                assert isinstance(error, InferenceServerException)
                assert error.status() == "StatusCode.INVALID_ARGUMENT"
                assert "was unregistered while the request used it" in str(error.message())
                # the agent goes on serving
                tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                assert c.infer("mlp", [tensor]).as_numpy("logits").shape == (x.shape[0], 10)


def test_cuda_shared_memory_is_answered_as_a_triton_without_a_gpu(
    client: grpcclient.InferenceServerClient,
) -> None:
    assert client.get_cuda_shared_memory_status(as_json=True) == {}
    client.unregister_cuda_shared_memory()
    with pytest.raises(InferenceServerException) as refused:
        # a cudaIpcMemHandle_t is 64 bytes, sent base64-encoded as tritonclient's helpers do
        client.register_cuda_shared_memory("frames", base64.b64encode(bytes(64)), 0, 64)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "CUDA shared memory is not supported" in str(refused.value)
