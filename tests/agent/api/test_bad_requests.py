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
    configs = {"mlp": "[batching]\npriority_levels = 2\n"}
    repo = copy_models(example_repo, tmp_path_factory.mktemp("repo"), "mlp", configs=configs)
    write_upper_model(repo)
    with serve(
        repo, max_request_bytes=200_000, max_tensor_elements=100_000, max_rows_per_request=64
    ) as running:
        yield running


def tensor(**overrides: Any) -> dict[str, Any]:
    return {"name": "input", "shape": [1, 256], "datatype": "FP32", "data": ROW, **overrides}


def text(**overrides: Any) -> dict[str, Any]:
    """A BYTES tensor for the upper model."""
    return {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"], **overrides}


def inputs(*tensors: Any, **fields: Any) -> dict[str, Any]:
    return {"inputs": list(tensors), **fields}


def one(**overrides: Any) -> dict[str, Any]:
    """A V2 body of one mlp tensor, with some of its fields changed."""
    return inputs(tensor(**overrides))


def params(**parameters: Any) -> dict[str, Any]:
    """A V2 body of one good mlp tensor, with request parameters."""
    return inputs(tensor(), parameters=parameters)


def output(name: str, **parameters: Any) -> dict[str, Any]:
    """A V2 body of one good mlp tensor, asking for an output with parameters."""
    return inputs(tensor(), outputs=[{"name": name, "parameters": parameters}])


def classify(top: int) -> dict[str, Any]:
    """A V2 body asking for the classification of the upper model's (BYTES) output."""
    return inputs(text(), outputs=[{"name": "upper", "parameters": {"classification": top}}])


def refused(body: Any, needle: str, code: str = "invalid_request") -> tuple[Any, int, str, str]:
    return (body, 400, needle, code)


NOT_FP32 = "inputs[0].data: cannot be read as FP32"
NULL_ROW = [None, *ROW[1:]]
STRING_ROW = ["1", *ROW[1:]]
DATALESS = {"name": "input", "shape": [1, 256], "datatype": "FP32"}  # tensor() without data

# description -> (body, status, part of the message, code)
V2_CASES = {
    "unknown input name": refused(one(name="pixels"), "'pixels'", "invalid_input_name"),
    "missing input": refused(
        inputs(tensor(name="x"), tensor(name="y")), "unknown input", "invalid_input_name"
    ),
    "datatype differs from model": refused(
        one(datatype="FP64"), "datatype FP64", "invalid_input_datatype"
    ),
    "shape differs from model": refused(
        one(shape=[2, 128]), "shape [2, 128]", "invalid_input_shape"
    ),
    "data shorter than shape": refused(one(data=ROW[:-1]), "inputs[0].data: has 255 values"),
    "unknown datatype": refused(one(datatype="FLOAT"), "inputs[0].datatype"),
    "negative dimension": refused(one(shape=[-1, 256]), "inputs[0].shape"),
    "strings in FP32 data": refused(one(data=["a"] * 256), NOT_FP32),
    "no inputs": refused({"inputs": []}, "inputs: must be a non-empty list"),
    "inputs not a list": refused({"inputs": {"name": "input"}}, "inputs:"),
    "input not an object": refused({"inputs": [3]}, "inputs[0]:"),
    "no data": refused(inputs(DATALESS), "inputs[0].data: is missing"),
    "same input twice": refused(inputs(tensor(), tensor()), "inputs[1].name"),
    "unknown output": refused(inputs(tensor(), outputs=[{"name": "probs"}]), "outputs[0].name"),
    "priority out of range": refused(params(priority=3), "parameters.priority"),
    "priority not an integer": refused(params(priority="high"), "parameters.priority"),
    "negative timeout": refused(params(timeout=-5), "parameters.timeout"),
    "sequence parameters": refused(params(sequence_id=4), "parameters.sequence_id"),
    "id not a string": refused({"id": 5, "inputs": [tensor()]}, "id: must be a string"),
    "too many elements": refused(one(shape=[400, 256], data=ROW), "exceed the limit of 100000"),
    "too many rows": refused(one(shape=[65, 256], data=ROW * 65), "65 rows exceed the limit of 64"),
    "BOOL data in FP32": refused(inputs(text(data=[1])), "BYTES data must be strings"),
    "null in FP32 data": refused(one(data=NULL_ROW), NOT_FP32),
    "a number as a string": refused(one(data=STRING_ROW), NOT_FP32),
    "booleans in FP32 data": refused(one(data=[True] * 256), NOT_FP32),
    "more than 64 dimensions": refused(
        one(shape=[1] * 65, data=[0.5]), "inputs[0].shape: has 65 dimensions"
    ),
    "binary_data_output not a boolean": refused(
        params(binary_data_output="false"), "parameters.binary_data_output"
    ),
    "binary_data not a boolean": refused(
        output("output", binary_data=0), "outputs[0].parameters.binary_data"
    ),
    "classification of a BYTES output": refused(
        classify(1), "outputs[0].parameters.classification: output 'upper' is BYTES"
    ),
}


@pytest.mark.parametrize(
    ("body", "status", "needle", "code"), list(V2_CASES.values()), ids=list(V2_CASES)
)
def test_v2_json_mistakes(
    agent: RunningAgent, body: dict[str, Any], status: int, needle: str, code: str
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
    paths = [
        "/v2/models/nope/infer",
        "/v2/models/mlp/versions/9/infer",
        "/v2/models/mlp/versions/x/infer",
        "/v1/models/nope:predict",
        "/v2/models/nope",
        "/v2/models/nope/stats",
    ]
    for path in paths:
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


LENGTH_HEADER = "Inference-Header-Content-Length"


def binary_head(shape: list[int], size: int) -> bytes:
    """The JSON header of a binary request: one FP32 input of ``size`` bytes after it."""
    binary = {
        "name": "input",
        "shape": shape,
        "datatype": "FP32",
        "parameters": {"binary_data_size": size},
    }
    return json.dumps({"inputs": [binary]}).encode()


# a well-formed binary request for the mlp (one row of zeros), the mistakes made from it
HEAD = binary_head([1, 256], 1024)
HEAD_LENGTH = str(len(HEAD))
BODY = HEAD + b"\x00" * 1024

# description -> (body, header length claimed, part of the message)
BINARY_CASES = {
    "header past the body": (BODY, str(len(BODY) + 10), LENGTH_HEADER),
    "header not a number": (BODY, "ten", LENGTH_HEADER),
    "binary shorter than claimed": (BODY[:-4], HEAD_LENGTH, "binary_data_size"),
    "extra binary bytes": (BODY + b"xxxx", HEAD_LENGTH, "bytes of binary data are not claimed"),
}


@pytest.mark.parametrize(
    ("body", "header", "needle"), list(BINARY_CASES.values()), ids=list(BINARY_CASES)
)
def test_binary_extension_mistakes(
    agent: RunningAgent, body: bytes, header: str, needle: str
) -> None:
    resp = agent.client.post("/v2/models/mlp/infer", content=body, headers={LENGTH_HEADER: header})
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]


def test_binary_tensor_of_more_than_64_dimensions(agent: RunningAgent) -> None:
    head = binary_head([1] * 65, 4)
    headers = {LENGTH_HEADER: str(len(head))}
    resp = agent.client.post("/v2/models/mlp/infer", content=head + b"\x00" * 4, headers=headers)
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
    resp = agent.client.post("/v2/models/upper/infer", json=classify(2))
    assert resp.status_code == 400, resp.text
    assert runs() == before


def test_binary_size_not_matching_shape(agent: RunningAgent) -> None:
    head = binary_head([1, 256], 1000)
    headers = {LENGTH_HEADER: str(len(head))}
    resp = agent.client.post("/v2/models/mlp/infer", content=head + b"\x00" * 1000, headers=headers)
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


# description -> (body, part of the message)
TFS_CASES = {
    "both formats": ({"instances": [ROW], "inputs": [ROW]}, "exactly one of"),
    "neither format": ({"rows": [ROW]}, "exactly one of"),
    "ragged instances": ({"instances": [ROW, ROW[:10]]}, "instances"),
    "unknown named input": ({"instances": [{"pixels": ROW}]}, "instances[0].pixels"),
    "named input missing": ({"inputs": {}}, "inputs.input: is missing"),
    "wrong signature": ({"signature_name": "classify", "instances": [ROW]}, "signature_name"),
    "b64 for a float input": ({"instances": [{"b64": "AAAA"}]}, "b64 values are for string inputs"),
    "bad base64": ({"instances": [{"b64": "!!"}]}, "b64: is not valid base64"),
    "wrong row length": ({"instances": [ROW[:100]]}, "shape"),
    "null in instances": ({"instances": [NULL_ROW]}, "instances: cannot be read as FP32"),
    "null in columns": ({"inputs": {"input": [NULL_ROW]}}, "inputs.input: cannot be read as FP32"),
    "a number as a string": ({"instances": [STRING_ROW]}, "instances: cannot be read as FP32"),
}


@pytest.mark.parametrize(("body", "needle"), list(TFS_CASES.values()), ids=list(TFS_CASES))
def test_tf_serving_mistakes(agent: RunningAgent, body: dict[str, Any], needle: str) -> None:
    resp = agent.client.post("/v1/models/mlp:predict", json=body)
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]


NOT_A_STRING = "instances[1]: string inputs take strings"

# description -> (body, part of the message)
TFS_STRING_CASES = {
    "a number": ({"instances": ["a", 3]}, NOT_A_STRING),
    "null": ({"instances": ["a", None]}, NOT_A_STRING),
    "a list among strings": ({"instances": ["a", ["b", "c"]]}, NOT_A_STRING),
    "a number in columns": ({"inputs": ["a", "b", 3]}, "inputs[2]: string inputs take strings"),
}


@pytest.mark.parametrize(
    ("body", "needle"), list(TFS_STRING_CASES.values()), ids=list(TFS_STRING_CASES)
)
def test_tf_serving_string_inputs_take_only_strings(
    agent: RunningAgent, body: dict[str, Any], needle: str
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
