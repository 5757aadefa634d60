"""OpenTelemetry traces of requests, read off the wire: a real OTLP/HTTP receiver on 127.0.0.1
decodes what the agent's SDK exports, and a client's own span (OpenTelemetry's SDK, as an app
would trace) is the parent of the agent's server span over REST and gRPC, whose queue and
compute children name the model, its version and runtime."""

from __future__ import annotations

import base64
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from agent.settings import AgentSettings
from runtimes.examples.classifier import golden_jpeg
from tests.agent.grpc.conftest import grpc_settings
from tests.agent.server import copy_models, serve
from tests.otlp import Receiver, client_span

ROW = [0.5] * 256


def test_a_request_s_trace_crosses_the_wire_with_queue_and_compute(
    example_repo: Path, tmp_path: Path, receiver: tuple[Receiver, str]
) -> None:
    found, endpoint = receiver
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    tracing = {"enabled": True, "endpoint": endpoint, "service_name": "agent-under-test"}
    app_span, headers, provider = client_span()
    ctx = app_span.get_span_context()
    app_trace, app_span_id = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
    with (
        tempfile_uds() as uds,
        serve(repo, tracing=tracing, grpc=grpc_settings(uds)) as agent,
    ):
        doc = {"inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32", "data": ROW}]}
        answer = agent.client.post("/v2/models/mlp/infer", json=doc, headers=headers)
        assert answer.status_code == 200, answer.text
        with grpcclient.InferenceServerClient(f"unix:{uds}") as grpc_client:
            tensor = grpcclient.InferInput("input", [1, 256], "FP32")
            tensor.set_data_from_numpy(np.full((1, 256), 0.5, np.float32))
            grpc_client.infer("mlp", [tensor], headers=headers)
        untraced = agent.client.get("/v2/health/ready")  # a new trace of its own
    app_span.end()
    provider.shutdown()
    # the agent flushed its spans as it stopped: to the receiver, over OTLP/HTTP
    assert found.paths and set(found.paths) == {"/v1/traces"}
    (rest,) = found.named("POST /v2/models/mlp/infer")
    (over_grpc,) = found.named("inference.GRPCInferenceService/ModelInfer")
    for server in (rest, over_grpc):
        assert (server.trace_id, server.parent_span_id) == (app_trace, app_span_id)
        assert server.attributes["edgefleet.model"] == "mlp"
        assert server.attributes["edgefleet.model.version"] == "1"
        assert server.attributes["edgefleet.runtime"] == "onnxruntime"
        assert server.attributes["resource:service.name"] == "agent-under-test"
        children = found.children(server)
        # REST decodes and encodes apart; gRPC's are inside its codec's call
        assert set(children) == (
            {"decode", "queue", "compute", "encode"} if server is rest else {"queue", "compute"}
        )
        compute = children["compute"]
        assert compute.attributes["edgefleet.batch.rows"] == 1
        # within the server span, in order: decode, queue, compute, encode
        laid = [children[n] for n in ("decode", "queue", "compute", "encode") if n in children]
        assert server.start_ns <= laid[0].start_ns and laid[-1].end_ns <= server.end_ns
        for before, after in zip(laid, laid[1:], strict=False):
            assert before.start_ns <= before.end_ns <= after.start_ns
    assert rest.attributes["http.response.status_code"] == 200
    assert over_grpc.attributes["rpc.grpc.status_code"] == 0
    # the response's traceparent names the agent's span, in the app's trace
    assert answer.headers["traceparent"].startswith(f"00-{app_trace}-{rest.span_id}-")
    (ready,) = found.named("GET /v2/health/ready")
    assert ready.trace_id != app_trace and ready.parent_span_id == ""
    assert untraced.headers["traceparent"].split("-")[1] == ready.trace_id


def test_a_pipeline_request_has_a_child_span_per_step_in_order(
    example_repo: Path, tmp_path: Path, receiver: tuple[Receiver, str]
) -> None:
    found, endpoint = receiver
    repo = copy_models(example_repo, tmp_path / "repo", "classifier")
    tracing = {"enabled": True, "endpoint": endpoint}
    image = golden_jpeg()
    with serve(repo, tracing=tracing) as agent:
        body = {"instances": [{"b64": base64.b64encode(image).decode()}]}
        answer = agent.client.post("/v1/models/classifier:predict", json=body)
        assert answer.status_code == 200, answer.text
    (server,) = found.named("POST /v1/models/classifier:predict")
    assert server.attributes["edgefleet.model"] == "classifier"
    assert server.attributes["edgefleet.runtime"] == "onnxruntime"
    steps = sorted(found.children(server).values(), key=lambda span: span.start_ns)
    names = [span.attributes["edgefleet.pipeline.step"] for span in steps]
    assert names == ["decode", "resize", "normalize", "layout", "cnn", "softmax", "top5"]
    assert [span.name for span in steps] == [f"step {n}" for n in names]
    # one after the other, within the request's span
    assert server.start_ns <= steps[0].start_ns and steps[-1].end_ns <= server.end_ns
    for before, after in zip(steps, steps[1:], strict=False):
        assert before.end_ns <= after.start_ns


def test_a_sample_ratio_of_zero_exports_nothing_and_still_answers_a_traceparent(
    example_repo: Path, tmp_path: Path, receiver: tuple[Receiver, str]
) -> None:
    found, endpoint = receiver
    repo = copy_models(example_repo, tmp_path / "repo", "mlp")
    with serve(repo, tracing={"enabled": True, "endpoint": endpoint, "sample_ratio": 0.0}) as a:
        doc = {"inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32", "data": ROW}]}
        answer = a.client.post("/v2/models/mlp/infer", json=doc)
    assert answer.status_code == 200
    flags = int(answer.headers["traceparent"].rsplit("-", 1)[1], 16)
    assert flags & 1 == 0  # not sampled, and says so (0x02: W3C's random trace id flag)
    assert found.spans == []


def tempfile_uds() -> Any:
    import tempfile

    class _Uds:
        def __enter__(self) -> Path:
            self._dir = tempfile.TemporaryDirectory(dir="/tmp")
            return Path(self._dir.name) / "agent.sock"

        def __exit__(self, *exc: object) -> None:
            self._dir.cleanup()

    return _Uds()


def test_the_docs_tracing_block_is_settings_the_agent_takes(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "agent.md").read_text()
    block = text.split("## Tracing", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    settings = AgentSettings(model_repository=tmp_path, **tomllib.loads(block))
    assert settings.tracing.enabled and settings.tracing.sample_ratio == 0.1
    assert settings.tracing.endpoint == "http://127.0.0.1:4318/v1/traces"
