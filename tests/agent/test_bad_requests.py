"""Bad requests of every kind get a 4xx naming the field, in the protocol's error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.models import write_upper_model
from tests.agent.server import RunningAgent, copy_models, serve

ROW = [0.5] * 256


@pytest.fixture(scope="module")
def agent(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = copy_models(example_repo, tmp_path_factory.mktemp("repo"), "mlp",
                       configs={"mlp": "[batching]\npriority_levels = 2\n"})  # fmt: skip
    write_upper_model(repo)
    with serve(
        repo, max_request_bytes=200_000, max_tensor_elements=100_000, max_rows_per_request=64
    ) as running:
        yield running


def tensor(**overrides: Any) -> dict[str, Any]:
    return {"name": "input", "shape": [1, 256], "datatype": "FP32", "data": ROW, **overrides}


V2_CASES = [
    # (description, body, status, field in the message, code)
    ("unknown input name", {"inputs": [tensor(name="pixels")]}, 400, "'pixels'", "invalid_input_name"),
    ("missing input", {"inputs": [{**tensor(), "name": "x"}, tensor(name="y")]}, 400, "unknown input", "invalid_input_name"),
    ("datatype differs from model", {"inputs": [tensor(datatype="FP64")]}, 400, "datatype FP64", "invalid_input_datatype"),
    ("shape differs from model", {"inputs": [tensor(shape=[2, 128])]}, 400, "shape [2, 128]", "invalid_input_shape"),
    ("data shorter than shape", {"inputs": [tensor(data=ROW[:-1])]}, 400, "inputs[0].data: has 255 values", "invalid_request"),
    ("unknown datatype", {"inputs": [tensor(datatype="FLOAT")]}, 400, "inputs[0].datatype", "invalid_request"),
    ("negative dimension", {"inputs": [tensor(shape=[-1, 256])]}, 400, "inputs[0].shape", "invalid_request"),
    ("strings in FP32 data", {"inputs": [tensor(data=["a"] * 256)]}, 400, "inputs[0].data: cannot be read as FP32", "invalid_request"),
    ("no inputs", {"inputs": []}, 400, "inputs: must be a non-empty list", "invalid_request"),
    ("inputs not a list", {"inputs": {"name": "input"}}, 400, "inputs:", "invalid_request"),
    ("input not an object", {"inputs": [3]}, 400, "inputs[0]:", "invalid_request"),
    ("no data", {"inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32"}]}, 400, "inputs[0].data: is missing", "invalid_request"),
    ("same input twice", {"inputs": [tensor(), tensor()]}, 400, "inputs[1].name", "invalid_request"),
    ("unknown output", {"inputs": [tensor()], "outputs": [{"name": "probs"}]}, 400, "outputs[0].name", "invalid_request"),
    ("priority out of range", {"inputs": [tensor()], "parameters": {"priority": 3}}, 400, "parameters.priority", "invalid_request"),
    ("priority not an integer", {"inputs": [tensor()], "parameters": {"priority": "high"}}, 400, "parameters.priority", "invalid_request"),
    ("negative timeout", {"inputs": [tensor()], "parameters": {"timeout": -5}}, 400, "parameters.timeout", "invalid_request"),
    ("sequence parameters", {"inputs": [tensor()], "parameters": {"sequence_id": 4}}, 400, "parameters.sequence_id", "invalid_request"),
    ("id not a string", {"id": 5, "inputs": [tensor()]}, 400, "id: must be a string", "invalid_request"),
    ("too many elements", {"inputs": [tensor(shape=[400, 256], data=ROW)]}, 400, "exceed the limit of 100000", "invalid_request"),
    ("too many rows", {"inputs": [tensor(shape=[65, 256], data=ROW * 65)]}, 400, "65 rows exceed the limit of 64", "invalid_request"),
    ("BOOL data in FP32", {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [1]}]}, 400, "BYTES data must be strings", "invalid_request"),
    ("null in FP32 data", {"inputs": [tensor(data=[None, *ROW[1:]])]}, 400, "inputs[0].data: cannot be read as FP32", "invalid_request"),
    ("a number as a string", {"inputs": [tensor(data=["1", *ROW[1:]])]}, 400, "inputs[0].data: cannot be read as FP32", "invalid_request"),
    ("booleans in FP32 data", {"inputs": [tensor(data=[True] * 256)]}, 400, "inputs[0].data: cannot be read as FP32", "invalid_request"),
    ("more than 64 dimensions", {"inputs": [tensor(shape=[1] * 65, data=[0.5])]}, 400, "inputs[0].shape: has 65 dimensions", "invalid_request"),
    ("binary_data_output not a boolean", {"inputs": [tensor()], "parameters": {"binary_data_output": "false"}}, 400, "parameters.binary_data_output", "invalid_request"),
    ("binary_data not a boolean", {"inputs": [tensor()], "outputs": [{"name": "output", "parameters": {"binary_data": 0}}]}, 400, "outputs[0].parameters.binary_data", "invalid_request"),
    ("classification of a BYTES output", {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
                                          "outputs": [{"name": "upper", "parameters": {"classification": 1}}]},
     400, "outputs[0].parameters.classification: output 'upper' is BYTES", "invalid_request"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "body", "status", "needle", "code"), V2_CASES, ids=[c[0] for c in V2_CASES]
)
def test_v2_json_mistakes(
    agent: RunningAgent, what: str, body: dict[str, Any], status: int, needle: str, code: str
) -> None:
    model = (
        "upper"
        if body["inputs"]
        and isinstance(body["inputs"], list)
        and isinstance(body["inputs"][0], dict)
        and body["inputs"][0].get("name") == "text"
        else "mlp"
    )
    resp = agent.client.post(f"/v2/models/{model}/infer", json=body)
    assert resp.status_code == status, resp.text
    doc = resp.json()
    assert needle in doc["error"], doc
    assert doc["code"] == code


def test_unknown_model_and_version_are_404(agent: RunningAgent) -> None:
    body = {"inputs": [tensor()]}
    for path in ("/v2/models/nope/infer", "/v2/models/mlp/versions/9/infer", "/v2/models/mlp/versions/x/infer",
                 "/v1/models/nope:predict", "/v2/models/nope", "/v2/models/nope/stats"):  # fmt: skip
        resp = (
            agent.client.post(path, json=body)
            if "infer" in path or "predict" in path
            else agent.client.get(path)
        )
        assert resp.status_code == 404, path
        assert resp.json()["code"] == "model_not_found"


def test_invalid_json_and_wrong_top_level(agent: RunningAgent) -> None:
    resp = agent.client.post("/v2/models/mlp/infer", content=b"{not json")
    assert resp.status_code == 400 and resp.json()["error"].startswith("body: not valid JSON")
    resp = agent.client.post("/v2/models/mlp/infer", json=[1, 2])
    assert resp.status_code == 400 and resp.json()["error"] == "body: must be a JSON object"


def test_body_over_the_limit_is_413(agent: RunningAgent) -> None:
    big = b"{" + b" " * 300_000 + b"}"
    resp = agent.client.post("/v2/models/mlp/infer", content=big)
    assert resp.status_code == 413 and "over the limit of 200000 bytes" in resp.json()["error"]


def test_gzip_bomb_is_413_not_memory(agent: RunningAgent) -> None:
    import gzip

    bomb = gzip.compress(b" " * 50_000_000)  # 50 MB of spaces, ~50 kB compressed
    resp = agent.client.post(
        "/v2/models/mlp/infer", content=bomb, headers={"Content-Encoding": "gzip"}
    )
    assert resp.status_code == 413 and "inflated body" in resp.json()["error"]
    resp = agent.client.post(
        "/v2/models/mlp/infer", content=b"xx", headers={"Content-Encoding": "br"}
    )
    assert resp.status_code == 400 and "Content-Encoding" in resp.json()["error"]


BINARY_CASES = [
    ("header past the body", lambda head, raw: (head + raw, str(len(head) + len(raw) + 10)), "Inference-Header-Content-Length"),
    ("header not a number", lambda head, raw: (head + raw, "ten"), "Inference-Header-Content-Length"),
    ("binary shorter than claimed", lambda head, raw: (head + raw[:-4], str(len(head))), "binary_data_size"),
    ("extra binary bytes", lambda head, raw: (head + raw + b"xxxx", str(len(head))), "bytes of binary data are not claimed"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "build", "needle"), BINARY_CASES, ids=[c[0] for c in BINARY_CASES]
)
def test_binary_extension_mistakes(agent: RunningAgent, what: str, build: Any, needle: str) -> None:
    raw = b"\x00" * 1024
    head = json.dumps({"inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 1024}}]}).encode()  # fmt: skip
    body, header = build(head, raw)
    resp = agent.client.post(
        "/v2/models/mlp/infer", content=body, headers={"Inference-Header-Content-Length": header}
    )
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]


def test_binary_tensor_of_more_than_64_dimensions(agent: RunningAgent) -> None:
    head = json.dumps({"inputs": [{"name": "input", "shape": [1] * 65, "datatype": "FP32",
                                   "parameters": {"binary_data_size": 4}}]}).encode()  # fmt: skip
    resp = agent.client.post("/v2/models/mlp/infer", content=head + b"\x00" * 4,
                             headers={"Inference-Header-Content-Length": str(len(head))})  # fmt: skip
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"].startswith("inputs[0].shape: has 65 dimensions")


def test_header_length_of_thousands_of_digits(agent: RunningAgent) -> None:
    resp = agent.client.post(
        "/v2/models/mlp/infer",
        content=b"{}",
        headers={"Inference-Header-Content-Length": "1" * 5000},
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"].startswith("Inference-Header-Content-Length")


def test_classification_refused_before_the_model_runs(agent: RunningAgent) -> None:
    def runs() -> int:
        stats = agent.client.get("/v2/models/upper/stats").json()["model_stats"][0]
        return int(stats["execution_count"])

    before = runs()
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
            "outputs": [{"name": "upper", "parameters": {"classification": 2}}]}  # fmt: skip
    resp = agent.client.post("/v2/models/upper/infer", json=body)
    assert resp.status_code == 400, resp.text
    assert runs() == before


def test_binary_size_not_matching_shape(agent: RunningAgent) -> None:
    head = json.dumps({"inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 1000}}]}).encode()  # fmt: skip
    resp = agent.client.post("/v2/models/mlp/infer", content=head + b"\x00" * 1000,
                             headers={"Inference-Header-Content-Length": str(len(head))})  # fmt: skip
    assert resp.status_code == 400
    assert (
        "inputs[0].parameters.binary_data_size: is 1000 bytes but shape [1, 256] of FP32 needs 1024"
        in resp.json()["error"]
    )


def test_raw_binary_of_wrong_length(agent: RunningAgent) -> None:
    resp = agent.client.post(
        "/v2/models/mlp/infer",
        content=b"\x00" * 1000,
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert resp.status_code == 400 and "1000 bytes" in resp.json()["error"]


TFS_CASES = [
    ("both formats", {"instances": [ROW], "inputs": [ROW]}, "exactly one of"),
    ("neither format", {"rows": [ROW]}, "exactly one of"),
    ("ragged instances", {"instances": [ROW, ROW[:10]]}, "instances"),
    ("unknown named input", {"instances": [{"pixels": ROW}]}, "instances[0].pixels"),
    ("named input missing", {"inputs": {}}, "inputs.input: is missing"),
    ("wrong signature", {"signature_name": "classify", "instances": [ROW]}, "signature_name"),
    ("b64 for a float input", {"instances": [{"b64": "AAAA"}]}, "b64 values are for string inputs"),
    ("bad base64", {"instances": [{"b64": "!!"}]}, "b64: is not valid base64"),
    ("wrong row length", {"instances": [ROW[:100]]}, "shape"),
    ("null in instances", {"instances": [[None, *ROW[1:]]]}, "instances: cannot be read as FP32"),
    ("null in columns", {"inputs": {"input": [[None, *ROW[1:]]]}}, "inputs.input: cannot be read as FP32"),
    ("a number as a string", {"instances": [["1", *ROW[1:]]]}, "instances: cannot be read as FP32"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "body", "needle"), TFS_CASES, ids=[c[0] for c in TFS_CASES])
def test_tf_serving_mistakes(
    agent: RunningAgent, what: str, body: dict[str, Any], needle: str
) -> None:
    resp = agent.client.post("/v1/models/mlp:predict", json=body)
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]


TFS_STRING_CASES = [
    ("a number", {"instances": ["a", 3]}, "instances[1]: string inputs take strings"),
    ("null", {"instances": ["a", None]}, "instances[1]: string inputs take strings"),
    ("a list among strings", {"instances": ["a", ["b", "c"]]}, "instances[1]: string inputs take strings"),
    ("a number in columns", {"inputs": ["a", "b", 3]}, "inputs[2]: string inputs take strings"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "body", "needle"), TFS_STRING_CASES, ids=[c[0] for c in TFS_STRING_CASES]
)
def test_tf_serving_string_inputs_take_only_strings(
    agent: RunningAgent, what: str, body: dict[str, Any], needle: str
) -> None:
    resp = agent.client.post("/v1/models/upper:predict", json=body)
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]


def test_tf_serving_string_inputs_as_strings_and_b64(agent: RunningAgent) -> None:
    resp = agent.client.post(
        "/v1/models/upper:predict", json={"instances": ["edge", {"b64": "ZmxlZXQ="}]}
    )
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"predictions": ["EDGE", "FLEET"]}


def test_repository_api_mistakes(agent: RunningAgent) -> None:
    assert agent.client.post("/v2/repository/models/nope/load").status_code == 404
    assert agent.client.post("/v2/repository/models/nope/unload").status_code == 404
    resp = agent.client.post(
        "/v2/repository/models/mlp/load", json={"parameters": {"config": "{}"}}
    )
    assert resp.status_code == 400 and "parameters" in resp.json()["error"]
    resp = agent.client.post("/v2/repository/index", json={"ready": "yes"})
    assert resp.status_code == 400 and resp.json()["error"].startswith("ready")


def test_no_mistake_left_the_server_unhealthy(agent: RunningAgent) -> None:
    assert agent.client.get("/v2/health/ready").status_code == 200
    assert agent.infer_json("mlp", [ROW]).status_code == 200
    text = agent.client.get("/metrics").text
    assert 'outcome="invalid_input_name"' in text and 'outcome="invalid_request"' in text
