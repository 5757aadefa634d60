"""Every endpoint of a real agent on 127.0.0.1, JSON and binary, with unmodified clients."""

from __future__ import annotations

import base64
import gzip
import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton

from runtimes.golden import GoldenSample
from tests.agent.models import write_upper_model
from tests.agent.server import RunningAgent, copy_models, serve, wait_until

MODELS = ("mlp", "cnn", "cnn_ir", "mlp_tflite")


@pytest.fixture(scope="module")
def agent(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = copy_models(example_repo, tmp_path_factory.mktemp("repo"), *MODELS)
    write_upper_model(repo)
    with serve(repo, device_hourly_cost=0.5) as running:
        yield running


@pytest.fixture(scope="module")
def golden(example_repo: Path) -> dict[str, GoldenSample]:
    return {m: GoldenSample.load(example_repo / m / "1" / "golden.npz") for m in ("mlp", "cnn")}


@pytest.fixture(scope="module")
def triton_client(agent: RunningAgent) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(agent.url.removeprefix("http://"))
    yield client
    client.close()


# -- health and metadata -------------------------------------------------------------------


def test_health(agent: RunningAgent, triton_client: triton.InferenceServerClient) -> None:
    assert agent.client.get("/v2/health/live").json() == {"live": True}
    assert agent.client.get("/v2/health/ready").status_code == 200
    assert triton_client.is_server_live() and triton_client.is_server_ready()


def test_server_metadata(agent: RunningAgent, triton_client: triton.InferenceServerClient) -> None:
    doc = agent.client.get("/v2").json()
    assert doc["name"] == "edgefleet"
    assert {"binary_tensor_data", "model_repository", "statistics", "schedule_policy"} <= set(
        doc["extensions"]
    )
    assert triton_client.get_server_metadata()["name"] == "edgefleet"


@pytest.mark.parametrize("path", ["/v2/models/mlp", "/v2/models/mlp/versions/1"])
def test_model_metadata(agent: RunningAgent, path: str) -> None:
    doc = agent.client.get(path).json()
    assert (
        doc["name"] == "mlp" and doc["versions"] == ["1"] and doc["platform"] == "onnxruntime_onnx"
    )
    assert doc["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 256]}]
    assert doc["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]


def test_model_metadata_per_runtime(agent: RunningAgent) -> None:
    assert agent.client.get("/v2/models/cnn_ir").json()["platform"] == "openvino_openvino_ir"
    assert agent.client.get("/v2/models/mlp_tflite").json()["platform"] == "litert_tflite"
    assert agent.client.get("/v2/models/upper").json()["inputs"][0]["datatype"] == "BYTES"


def test_model_readiness_per_model_and_version(
    agent: RunningAgent, triton_client: triton.InferenceServerClient
) -> None:
    assert agent.client.get("/v2/models/mlp/ready").json() == {"name": "mlp", "ready": True}
    assert agent.client.get("/v2/models/mlp/versions/1/ready").status_code == 200
    assert agent.client.get("/v2/models/mlp/versions/7/ready").status_code == 404
    assert agent.client.get("/v2/models/nope/ready").status_code == 404
    assert triton_client.is_model_ready("cnn") and not triton_client.is_model_ready("cnn", "3")


def test_model_config(agent: RunningAgent) -> None:
    doc = agent.client.get("/v2/models/mlp/config").json()["edgefleet"]
    assert doc["placement"]["runtime"] == "onnxruntime" and doc["instances"] >= 1
    # served as measured at load (tune is on by default): 0 where batching did not pay
    assert doc["batching"]["max_batch_size"] in (0, doc["batch_tuning"]["max_batch_size"])


# -- inference: V2 JSON, binary, raw --------------------------------------------------------


@pytest.mark.parametrize("model", ["mlp", "mlp_tflite"])
def test_infer_json_flat_and_nested(
    agent: RunningAgent, golden: dict[str, GoldenSample], model: str
) -> None:
    g = golden["mlp"]
    x, expected = g.inputs["input"], g.outputs["logits"]
    for data in (x.ravel().tolist(), x.tolist()):
        body = {
            "id": "req-7",
            "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": data}],
        }
        resp = agent.client.post(f"/v2/models/{model}/infer", json=body)
        assert resp.status_code == 200, resp.text
        doc = resp.json()
        assert doc["id"] == "req-7" and doc["model_name"] == model and doc["model_version"] == "1"
        (out,) = doc["outputs"]
        assert out["name"] == "logits" and out["datatype"] == "FP32" and out["shape"] == [8, 10]
        np.testing.assert_allclose(
            np.array(out["data"]).reshape(8, 10), expected, rtol=1e-4, atol=1e-4
        )


def test_infer_with_version_in_path(agent: RunningAgent, golden: dict[str, GoldenSample]) -> None:
    x = golden["mlp"].inputs["input"][:1]
    body = {
        "inputs": [
            {"name": "input", "shape": [1, 256], "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }
    assert agent.client.post("/v2/models/mlp/versions/1/infer", json=body).status_code == 200
    assert agent.client.post("/v2/models/mlp/versions/2/infer", json=body).status_code == 404


@pytest.mark.parametrize("model", ["cnn", "cnn_ir"])
@pytest.mark.parametrize("binary_in,binary_out", [(True, True), (False, True), (True, False)])
def test_tritonclient_binary_and_json(
    triton_client: triton.InferenceServerClient,
    golden: dict[str, GoldenSample],
    model: str,
    binary_in: bool,
    binary_out: bool,
) -> None:
    g = golden["cnn"]
    inp = triton.InferInput("input", list(g.inputs["input"].shape), "FP32")
    inp.set_data_from_numpy(g.inputs["input"], binary_data=binary_in)
    out = triton.InferRequestedOutput("logits", binary_data=binary_out)
    result = triton_client.infer(model, [inp], outputs=[out], request_id="abc")
    assert result.get_response()["id"] == "abc"
    np.testing.assert_allclose(result.as_numpy("logits"), g.outputs["logits"], rtol=1e-3, atol=1e-3)


def test_tritonclient_default_outputs_come_back_binary(
    agent: RunningAgent, golden: dict[str, GoldenSample]
) -> None:
    x = golden["mlp"].inputs["input"]
    inp = triton.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    body, json_size = triton._utils._get_inference_request(  # the client's own encoder
        [inp], "", None, 0, False, False, 0, None, None
    )
    resp = agent.client.post(
        "/v2/models/mlp/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(json_size)},
    )
    assert resp.status_code == 200
    header = int(resp.headers["inference-header-content-length"])
    doc = json.loads(resp.content[:header])
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == 8 * 10 * 4
    values = np.frombuffer(resp.content[header:], dtype="<f4").reshape(8, 10)
    np.testing.assert_allclose(values, golden["mlp"].outputs["logits"], rtol=1e-4, atol=1e-4)


def test_tritonclient_gzip_request(
    triton_client: triton.InferenceServerClient, golden: dict[str, GoldenSample]
) -> None:
    x = golden["mlp"].inputs["input"]
    inp = triton.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = triton_client.infer("mlp", [inp], request_compression_algorithm="gzip")
    np.testing.assert_allclose(
        result.as_numpy("logits"), golden["mlp"].outputs["logits"], rtol=1e-4, atol=1e-4
    )


def test_raw_binary_request_is_batch_one(
    agent: RunningAgent, golden: dict[str, GoldenSample]
) -> None:
    x = golden["mlp"].inputs["input"][:1]
    resp = agent.client.post(
        "/v2/models/mlp/infer",
        content=x.astype("<f4").tobytes(),
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert resp.status_code == 200, resp.text
    header = int(resp.headers["inference-header-content-length"])
    values = np.frombuffer(resp.content[header:], dtype="<f4")
    np.testing.assert_allclose(values, golden["mlp"].outputs["logits"][0], rtol=1e-4, atol=1e-4)


def test_bytes_tensors_json_and_binary(
    agent: RunningAgent, triton_client: triton.InferenceServerClient
) -> None:
    body = {
        "inputs": [
            {"name": "text", "shape": [3], "datatype": "BYTES", "data": ["edge", "fleet", "ok"]}
        ]
    }
    doc = agent.client.post("/v2/models/upper/infer", json=body).json()
    assert doc["outputs"][0]["data"] == ["EDGE", "FLEET", "OK"]
    inp = triton.InferInput("text", [2], "BYTES")
    inp.set_data_from_numpy(
        np.array([b"abc", b"\xc3\xa9t\xc3\xa9"], dtype=object)
    )  # "été" in UTF-8
    result = triton_client.infer("upper", [inp])
    # the C locale upper-cases ASCII only; the UTF-8 bytes travel through intact
    assert result.as_numpy("upper").tolist() == [b"ABC", "éTé".encode()]


def test_classification_extension(
    triton_client: triton.InferenceServerClient, golden: dict[str, GoldenSample]
) -> None:
    x = golden["mlp"].inputs["input"]
    inp = triton.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = triton_client.infer(
        "mlp", [inp], outputs=[triton.InferRequestedOutput("logits", class_count=2)]
    )
    top = result.as_numpy("logits")
    assert top.shape == (8, 2)
    expected = np.argsort(-golden["mlp"].outputs["logits"], axis=1)[:, :2]
    assert [[int(c.decode().split(":")[1]) for c in row] for row in top] == expected.tolist()


# -- TF Serving ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/v1/models/mlp:predict", "/v1/models/mlp/versions/1:predict", "/v1/models/mlp/predict"],
)
def test_tf_serving_predict_row_format(
    agent: RunningAgent, golden: dict[str, GoldenSample], path: str
) -> None:
    g = golden["mlp"]
    resp = agent.client.post(path, json={"instances": g.inputs["input"][:3].tolist()})
    assert resp.status_code == 200, resp.text
    np.testing.assert_allclose(
        np.array(resp.json()["predictions"]), g.outputs["logits"][:3], rtol=1e-4, atol=1e-4
    )


def test_tf_serving_predict_named_rows_and_columns(
    agent: RunningAgent, golden: dict[str, GoldenSample]
) -> None:
    g = golden["mlp"]
    rows = [{"input": r} for r in g.inputs["input"][:2].tolist()]
    named = agent.client.post("/v1/models/mlp:predict", json={"instances": rows}).json()
    np.testing.assert_allclose(
        np.array(named["predictions"]), g.outputs["logits"][:2], rtol=1e-4, atol=1e-4
    )
    for columns in (g.inputs["input"][:2].tolist(), {"input": g.inputs["input"][:2].tolist()}):
        doc = agent.client.post("/v1/models/mlp:predict", json={"inputs": columns}).json()
        np.testing.assert_allclose(
            np.array(doc["outputs"]), g.outputs["logits"][:2], rtol=1e-4, atol=1e-4
        )


def test_tf_serving_b64_strings(agent: RunningAgent) -> None:
    b64 = base64.b64encode(b"fleet").decode()
    doc = agent.client.post(
        "/v1/models/upper:predict", json={"instances": [{"b64": b64}, "edge"]}
    ).json()
    assert doc == {"predictions": ["FLEET", "EDGE"]}


def test_tf_serving_status_and_metadata(agent: RunningAgent) -> None:
    status = agent.client.get("/v1/models/mlp").json()
    ok = {"error_code": "OK", "error_message": ""}
    available = {"version": "1", "state": "AVAILABLE", "status": ok}
    assert status == {"model_version_status": [available]}
    assert agent.client.get("/v1/models/mlp/versions/1").status_code == 200
    meta = agent.client.get("/v1/models/mlp/metadata").json()
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["inputs"]["input"]["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in sig["inputs"]["input"]["tensor_shape"]["dim"]] == ["-1", "256"]
    assert agent.client.get("/v1/models/nope").json()["error"].startswith("Servable not found")


# -- repository, statistics, metrics, headers ---------------------------------------------


def test_repository_index(agent: RunningAgent) -> None:
    rows = agent.client.get("/v2/repository/index").json()
    assert {(r["name"], r["version"], r["state"]) for r in rows} == {
        (m, "1", "READY") for m in (*MODELS, "upper")
    }
    assert agent.client.post("/v2/repository/index", json={"ready": True}).json() == rows


def test_statistics_count_rows_and_batches(
    agent: RunningAgent, triton_client: triton.InferenceServerClient
) -> None:
    before = triton_client.get_inference_statistics("mlp_tflite")["model_stats"][0]
    # two rows: one batch whatever size tuning chose at load (one row: no batching, whole)
    agent.infer_json("mlp_tflite", np.zeros((2, 256)))
    after = agent.client.get("/v2/models/mlp_tflite/versions/1/stats").json()["model_stats"][0]
    assert after["inference_count"] == before["inference_count"] + 2
    assert after["execution_count"] == before["execution_count"] + 1
    assert (
        after["inference_stats"]["success"]["count"]
        == before["inference_stats"]["success"]["count"] + 1
    )
    assert any(b["batch_size"] == 2 for b in after["batch_stats"])
    every = agent.client.get("/v2/models/stats").json()["model_stats"]
    assert {s["name"] for s in every} == {*MODELS, "upper"}


def test_metrics_exposition(agent: RunningAgent) -> None:
    agent.infer_json("mlp", np.zeros((2, 256)))
    text = agent.client.get("/metrics").text
    for name in (
        'edgefleet_requests_total{model="mlp",outcome="success",version="1"}',
        'edgefleet_inference_rows_total{model="mlp",version="1"}',
        'edgefleet_batch_executions_total{model="mlp",version="1"}',
        'edgefleet_batch_size_rows_bucket{le="2.0",model="mlp",version="1"}',
        'edgefleet_queue_seconds_count{model="mlp",version="1"}',
        'edgefleet_compute_seconds_count{model="mlp",version="1"}',
        'edgefleet_request_seconds_count{model="mlp",version="1"}',
        'edgefleet_queue_depth{model="mlp",version="1"} 0.0',
        'edgefleet_model_ready{model="mlp",version="1"} 1.0',
        'edgefleet_model_load_seconds{model="mlp",version="1"}',
        'edgefleet_model_memory_bytes{model="mlp",version="1"}',
        "process_resident_memory_bytes ",
        "process_cpu_seconds_total ",
        "edgefleet_cost_per_1k_predictions ",
    ):
        assert name in text, name
    # no accelerator on this machine: the series is absent, not zero
    assert "edgefleet_accelerator_utilization_ratio" not in text
    assert "_created" not in text


def test_request_id_trace_and_timing_headers(agent: RunningAgent) -> None:
    body = {
        "inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32", "data": [0.0] * 256}]
    }
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    resp = agent.client.post(
        "/v2/models/mlp/infer",
        json=body,
        headers={"X-Request-ID": "client-42", "traceparent": trace},
    )
    assert resp.headers["x-request-id"] == "client-42"
    assert resp.json()["id"] == "client-42"  # no V2 id given: the request id stands in
    assert re.match(
        r"^00-0af7651916cd43dd8448eb211c80319c-[0-9a-f]{16}-01$", resp.headers["traceparent"]
    )
    assert not resp.headers["traceparent"].endswith("b7ad6b7169203331-01")  # our own span
    assert re.match(
        r"^queue;dur=[\d.]+, compute;dur=[\d.]+, total;dur=[\d.]+$", resp.headers["server-timing"]
    )
    generated = agent.client.get("/v2/health/live").headers["x-request-id"]
    assert re.match(r"^[0-9a-f]{32}$", generated)


def test_access_log_is_json_with_request_id(
    agent: RunningAgent, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    with caplog.at_level(logging.INFO, logger="edgefleet.agent.access"):
        agent.client.post(
            "/v2/models/mlp/infer",
            headers={"X-Request-ID": "log-me"},
            json={
                "inputs": [
                    {"name": "input", "shape": [1, 256], "datatype": "FP32", "data": [0.0] * 256}
                ]
            },
        )

        # the line is written once the response has left: the client may read it first
        def logged() -> list[logging.LogRecord]:
            return [r for r in caplog.records if getattr(r, "request_id", None) == "log-me"]

        wait_until(logged, what="the access log line")
    record = logged()[0]
    assert (record.model, record.version, record.status) == ("mlp", "1", 200)  # type: ignore[attr-defined]
    assert record.compute_ms is not None  # type: ignore[attr-defined]


def test_binary_bytes_input_with_length_prefixes(agent: RunningAgent) -> None:
    items = [b"a", b"bc"]
    raw = b"".join(struct.pack("<I", len(i)) + i for i in items)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "shape": [2],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "upper", "parameters": {"binary_data": False}}],
        }
    ).encode()
    resp = agent.client.post(
        "/v2/models/upper/infer",
        content=gzip.compress(head + raw),
        headers={"Inference-Header-Content-Length": str(len(head)), "Content-Encoding": "gzip"},
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["outputs"][0]["data"] == ["A", "BC"]
