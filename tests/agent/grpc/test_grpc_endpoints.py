"""tritonclient.grpc, unmodified, against a real agent: health, metadata, configuration,
statistics, the repository and inference, with outputs equal to ONNX Runtime's own."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import InferenceServerException

from runtimes.golden import GoldenSample
from tests.agent.grpc.conftest import MODELS, GrpcAgent, grpc_settings
from tests.agent.server import copy_models, serve


def ort_outputs(example_repo: Path, model: str, x: np.ndarray) -> np.ndarray:
    """The model's output as ONNX Runtime computes it, with no agent in between."""
    session = ort.InferenceSession(
        str(example_repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    (out,) = session.run(None, {session.get_inputs()[0].name: x})
    return np.asarray(out)


def golden_input(example_repo: Path, model: str) -> np.ndarray:
    sample = GoldenSample.load(example_repo / model / "1" / "golden.npz")
    return sample.inputs["input"]


def infer_input(x: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def test_health_and_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("mlp")
    assert not client.is_model_ready("no-such-model")
    meta = client.get_server_metadata()
    assert meta.name == "edgefleet"
    assert "system_shared_memory" in meta.extensions


def test_model_metadata_and_config(
    grpc_agent: GrpcAgent, client: grpcclient.InferenceServerClient
) -> None:
    meta = client.get_model_metadata("mlp", as_json=True)
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "256"]}]
    assert meta["outputs"][0]["name"] == "logits"
    config = client.get_model_config("cnn", as_json=True)["config"]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    # joined by the batcher or not (as measured at load), its rows batch: dims leave them out
    assert int(config["max_batch_size"]) == 32
    assert config["input"][0]["dims"] == ["3", "224", "224"]


@pytest.mark.parametrize("model", MODELS)
def test_the_config_is_triton_s_and_one_document_over_rest_and_grpc(
    grpc_agent: GrpcAgent, client: grpcclient.InferenceServerClient, model: str
) -> None:
    """What perf_analyzer and Model Analyzer read, in Triton's fields, on both transports;
    REST keeps edgefleet's own document beside them."""
    rest = grpc_agent.rest.client.get(f"/v2/models/{model}/config").json()
    ours = rest.pop("edgefleet")
    assert ours["placement"]["runtime"] == "onnxruntime" and ours["instances"] >= 1
    over_grpc = client.get_model_config(model).config
    assert json_format.ParseDict(rest, model_config_pb2.ModelConfig()) == over_grpc
    lv = grpc_agent.rest.state.service.resolve(model, None)
    assert rest["name"] == model and rest["backend"] == "onnxruntime"
    assert rest["platform"] == "onnxruntime_onnx" and rest["version_policy"] == {
        "specific": {"versions": [1]}
    }
    assert rest["instance_group"][0]["kind"] == "KIND_CPU"
    assert rest["instance_group"][0]["count"] == ours["instances"]
    assert [t["name"] for t in rest["input"]] == [t.name for t in lv.signature.inputs]
    # both models' rows batch: requests of up to the configured size, dims without the rows
    assert rest["max_batch_size"] == lv.config.batching.max_batch_size == 32
    assert rest["input"][0]["dims"] == list(lv.signature.inputs[0].shape[1:])
    if lv.batcher.batched:  # the batcher joins requests: its settings, in Triton's names
        batching = rest["dynamic_batching"]
        assert batching["preferred_batch_size"] == [lv.batcher.max_rows]
        assert (
            batching["default_queue_policy"]["max_queue_size"] == lv.batcher.config.max_queue_size
        )
    else:  # measured at load not to pay: served one request at a time, as Triton's default
        assert "dynamic_batching" not in rest and ours["batching"]["max_batch_size"] == 0


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_infer_equals_onnx_runtime(grpc_agent: GrpcAgent, example_repo: Path, model: str) -> None:
    x = golden_input(example_repo, model)
    expected = ort_outputs(example_repo, model, x)
    for unix in (False, True):  # TCP, and the Unix socket
        with grpc_agent.client(unix=unix) as c:
            result = c.infer(model, [infer_input(x)], request_id="r-1")
            np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)
            assert result.get_response().id == "r-1"
            assert result.get_response().model_version == "1"


def test_statistics_count_grpc_requests(
    client: grpcclient.InferenceServerClient, example_repo: Path
) -> None:
    def count() -> int:
        stats = client.get_inference_statistics("mlp", as_json=True)["model_stats"]
        return sum(int(s.get("inference_count", 0)) for s in stats)

    before = count()
    x = golden_input(example_repo, "mlp")
    client.infer("mlp", [infer_input(x)])
    assert count() == before + x.shape[0]
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {s["name"] for s in everything} == {"mlp", "cnn"}


def test_statistics_are_triton_s_with_equal_compute_counts_on_both_transports(
    grpc_agent: GrpcAgent, client: grpcclient.InferenceServerClient, example_repo: Path
) -> None:
    """perf_analyzer aborts on statistics whose compute_input, compute_infer and
    compute_output counts differ, and reads every duration and the cache's over REST."""
    x = golden_input(example_repo, "mlp")
    for _ in range(3):
        client.infer("mlp", [infer_input(x)])
    rest = grpc_agent.rest.client.get("/v2/models/mlp/stats").json()
    over_grpc = client.get_inference_statistics("mlp")
    (stats,) = rest["model_stats"]
    assert stats.pop("fail_by_reason") == {}  # edgefleet's own, beside Triton's
    parsed = json_format.ParseDict(rest, service_pb2.ModelStatisticsResponse())
    assert parsed == over_grpc
    durations = stats["inference_stats"]
    counts = {
        k: durations[k]["count"] for k in ("compute_input", "compute_infer", "compute_output")
    }
    assert set(counts.values()) == {durations["success"]["count"]} and counts["compute_infer"] >= 3
    assert durations["compute_infer"]["ns"] > 0 and durations["queue"]["count"] >= 3
    assert durations["cache_hit"] == durations["cache_miss"] == {"count": 0, "ns": 0}
    for size in stats["batch_stats"]:
        assert size["compute_input"]["count"] == size["compute_infer"]["count"]
        assert size["compute_output"]["count"] == size["compute_infer"]["count"]


def test_stream_infer_answers_in_order(
    client: grpcclient.InferenceServerClient, example_repo: Path
) -> None:
    x = golden_input(example_repo, "mlp")
    expected = ort_outputs(example_repo, "mlp", x)
    answers: list[tuple[object, object]] = []
    client.start_stream(callback=lambda result, error: answers.append((result, error)))
    try:
        for i in range(6):
            client.async_stream_infer("mlp", [infer_input(x[i : i + 1])], request_id=str(i))
        client.async_stream_infer("nope", [infer_input(x[:1])], request_id="bad")
    finally:
        client.stop_stream()  # waits for every answer
    assert len(answers) == 7
    for i, (result, error) in enumerate(answers[:6]):
        assert error is None
        assert isinstance(result, grpcclient.InferResult)
        assert result.get_response().id == str(i)
        np.testing.assert_allclose(result.as_numpy("logits"), expected[i : i + 1], atol=1e-5)
    assert answers[6][0] is None
    assert "nope" in str(answers[6][1])


def test_repository_index_unload_and_load(client: grpcclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {(m["name"], m["state"]) for m in index} == {("mlp", "READY"), ("cnn", "READY")}
    client.unload_model("mlp")
    assert not client.is_model_ready("mlp")
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [infer_input(np.zeros((1, 256), np.float32))])
    assert info.value.status() in ("StatusCode.NOT_FOUND", "StatusCode.UNAVAILABLE")
    client.load_model("mlp")
    assert client.is_model_ready("mlp")


@pytest.mark.parametrize(
    ("model", "x", "status", "words"),
    [
        ("nope", np.zeros((1, 256), np.float32), "NOT_FOUND", "nope"),
        ("mlp", np.zeros((1, 255), np.float32), "INVALID_ARGUMENT", "input"),
        ("mlp", np.zeros((1, 2, 256), np.float32), "INVALID_ARGUMENT", "input"),
    ],
)
def test_errors_have_their_status(
    client: grpcclient.InferenceServerClient, model: str, x: np.ndarray, status: str, words: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, [infer_input(x)])
    assert info.value.status() == f"StatusCode.{status}"
    assert words in str(info.value.message())


def test_contents_and_outputs_by_name(grpc_agent: GrpcAgent) -> None:
    """Typed contents (not raw) as Triton's C++ and Go clients may send them."""
    from agent.grpc.proto import grpc_service_pb2 as pb

    x = np.arange(256, dtype=np.float32).reshape(1, 256) / 256
    request = pb.ModelInferRequest(model_name="mlp")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 256])
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    request.outputs.add(name="logits")
    raw = call_raw(grpc_agent.address, "ModelInfer", request.SerializeToString())
    response = pb.ModelInferResponse.FromString(raw)
    assert [o.name for o in response.outputs] == ["logits"]
    logits = np.frombuffer(response.raw_output_contents[0], np.float32)
    assert logits.shape == (10,)


def call_raw(address: str, method: str, body: bytes) -> bytes:
    """A call with no message types on either side: bytes in, bytes out."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
        answer: bytes = call(body, timeout=30)
        return answer


def test_api_key_in_metadata(example_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        grpc_config = grpc_settings(Path(short) / "a.sock")
        with serve(repo, grpc=grpc_config, api_key="s3cret"):
            address = f"127.0.0.1:{grpc_config['port']}"
            with grpcclient.InferenceServerClient(address) as c:
                assert c.is_server_live() and c.is_server_ready()  # open, as REST's probes
                with pytest.raises(InferenceServerException) as info:
                    c.get_server_metadata()
                assert info.value.status() == "StatusCode.UNAUTHENTICATED"
                good = {"authorization": "Bearer s3cret"}
                assert c.get_server_metadata(headers=good).name == "edgefleet"
                x = np.zeros((1, 256), np.float32)
                result = c.infer("mlp", [infer_input(x)], headers={"x-api-key": "s3cret"})
                assert result.as_numpy("logits").shape == (1, 10)
                with pytest.raises(InferenceServerException) as info:
                    c.infer("mlp", [infer_input(x)], headers={"authorization": "Bearer no"})
                assert info.value.status() == "StatusCode.UNAUTHENTICATED"


def test_grpc_beyond_loopback_needs_a_key(example_repo: Path) -> None:
    from agent.settings import AgentSettings

    with pytest.raises(ValueError, match="grpc.host"):
        AgentSettings(model_repository=example_repo, grpc={"enabled": True, "host": "0.0.0.0"})


def test_request_ids_come_back_in_the_trailers(grpc_agent: GrpcAgent) -> None:
    live = "/inference.GRPCInferenceService/ServerLive"
    with grpc.insecure_channel(grpc_agent.address) as channel:
        call = channel.unary_unary(live)
        _, given = call.with_call(b"", metadata=(("x-request-id", "frame-7"),), timeout=30)
        _, made = call.with_call(b"", metadata=(("x-request-id", "bad id!"),), timeout=30)
    assert ("x-request-id", "frame-7") in given.trailing_metadata()
    (made_id,) = [v for k, v in made.trailing_metadata() if k == "x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", made_id)
