"""V2 and TF Serving codecs on their own: every V2 datatype both ways, JSON and binary."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agent.api.v2_codec import (
    RequestedOutput,
    check_classification,
    decode_request,
    encode_response,
)
from agent.errors import RequestError
from agent.serving.classification import classify
from runtimes.datatypes import numpy_dtype
from runtimes.signature import ModelSignature, TensorSpec

SAMPLES = {
    "BOOL": [True, False, True, True],
    "UINT8": [0, 1, 254, 255],
    "UINT16": [0, 1, 65534, 65535],
    "UINT32": [0, 1, 2**32 - 2, 2**32 - 1],
    "UINT64": [0, 1, 2**63, 2**64 - 1],
    "INT8": [-128, -1, 0, 127],
    "INT16": [-32768, -1, 0, 32767],
    "INT32": [-(2**31), -1, 0, 2**31 - 1],
    "INT64": [-(2**63), -1, 0, 2**63 - 1],
    "FP16": [0.5, -1.25, 2.0, 65504.0],
    "FP32": [0.1, -2.5, 3.4e38, 1e-38],
    "FP64": [0.1, -2.5, 1e308, 5e-324],
    "BYTES": ["a", "", "ünïcode", "x" * 100],
}


def _request(datatype: str, data: list[object], binary: bool) -> tuple[bytes, int | None]:
    tensor: dict[str, object] = {"name": "t", "shape": [2, 2], "datatype": datatype}
    if not binary:
        tensor["data"] = data
        return json.dumps({"inputs": [tensor]}).encode(), None
    if datatype == "BYTES":
        raw = b"".join(len(s.encode()).to_bytes(4, "little") + s.encode() for s in data)  # type: ignore[attr-defined]
    else:
        raw = (
            np.array(data, dtype=numpy_dtype(datatype))
            .astype(numpy_dtype(datatype).newbyteorder("<"))
            .tobytes()
        )
    tensor["parameters"] = {"binary_data_size": len(raw)}
    head = json.dumps({"inputs": [tensor]}).encode()
    return head + raw, len(head)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_every_datatype_decodes_and_encodes_back(datatype: str, binary: bool) -> None:
    data = SAMPLES[datatype]
    body, header = _request(datatype, data, binary)
    decoded = decode_request(body, header, None, max_elements=100)
    array = decoded.inputs["t"]
    assert array.shape == (2, 2)
    expected = (
        [s.encode() for s in data]
        if datatype == "BYTES"
        else np.array(data, dtype=numpy_dtype(datatype))
    )  # type: ignore[union-attr]
    assert np.array_equal(array.reshape(-1), np.asarray(expected, dtype=array.dtype))
    for binary_out in (False, True):
        payload, json_length = encode_response("m", "1", "id", {"t": array}, None, binary_out)
        head = json.loads(payload[:json_length] if json_length else payload)
        out = head["outputs"][0]
        assert out["datatype"] == datatype and out["shape"] == [2, 2]
        # the response's tensor, sent back as a request, decodes to the same array
        request_head = json.dumps({"inputs": [out]}).encode()
        if json_length is None:
            again = decode_request(request_head, None, None, max_elements=100)
        else:
            again = decode_request(
                request_head + payload[json_length:], len(request_head), None, max_elements=100
            )
        assert np.array_equal(again.inputs["t"], array), (datatype, binary_out)


def test_out_of_range_integer_is_a_clear_error() -> None:
    body = json.dumps(
        {"inputs": [{"name": "t", "shape": [1], "datatype": "UINT8", "data": [300]}]}
    ).encode()
    with pytest.raises(RequestError, match=r"inputs\[0\]\.data: cannot be read as UINT8"):
        decode_request(body, None, None, max_elements=10)


def test_bool_data_must_be_booleans() -> None:
    body = json.dumps(
        {"inputs": [{"name": "t", "shape": [2], "datatype": "BOOL", "data": [1, 0]}]}
    ).encode()
    with pytest.raises(RequestError, match="BOOL data must be true or false"):
        decode_request(body, None, None, max_elements=10)


def test_classification_orders_by_value() -> None:
    out = classify(np.array([[0.1, 0.7, 0.2], [3.0, -1.0, 2.0]], np.float32), 2)
    assert out.tolist() == [[b"0.700000:1", b"0.200000:2"], [b"3.000000:0", b"2.000000:2"]]


@pytest.mark.parametrize(
    ("values", "dtype", "expected"),
    [
        ([0, 200, 7, 3], np.uint8, [b"200.000000:1", b"7.000000:2"]),  # -200 wraps to 56
        ([-128, 5, 127, 0], np.int8, [b"127.000000:2", b"5.000000:1"]),  # -(-128) is -128
        ([2**63, 1, 0, 2], np.uint64, [b"9223372036854775808.000000:0", b"2.000000:3"]),
        ([1.0, 3.0, 3.0, 2.0], np.float32, [b"3.000000:1", b"3.000000:2"]),  # ties: first first
        ([1, 3, 3, 2], np.int32, [b"3.000000:1", b"3.000000:2"]),
    ],
)
def test_classification_orders_every_numeric_type_descending(
    values: list[int], dtype: type, expected: list[bytes]
) -> None:
    assert classify(np.array([values], dtype=dtype), 2).tolist() == [expected]


def test_classification_of_strings_or_booleans_is_refused_before_inference() -> None:
    signature = ModelSignature(
        inputs=(TensorSpec(name="x", datatype="FP32", shape=(-1, 2)),),
        outputs=(
            TensorSpec(name="label", datatype="BYTES", shape=(-1,)),
            TensorSpec(name="mask", datatype="BOOL", shape=(-1, 2)),
            TensorSpec(name="score", datatype="UINT8", shape=(-1, 2)),
        ),
    )
    for name in ("label", "mask"):
        requested = [RequestedOutput("score", classification=1), RequestedOutput(name, None, 1)]
        with pytest.raises(
            RequestError, match=rf"outputs\[1\]\.parameters\.classification: output '{name}'"
        ):
            check_classification(requested, signature)
    check_classification([RequestedOutput("score", classification=1)], signature)
    check_classification(
        [RequestedOutput("unknown", classification=1)], signature
    )  # the service names it


def _decode(datatype: str, data: object, shape: list[int] | None = None) -> np.ndarray:
    tensor = {"name": "t", "shape": shape or [len(data)], "datatype": datatype, "data": data}  # type: ignore[arg-type]
    return decode_request(
        json.dumps({"inputs": [tensor]}).encode(), None, None, max_elements=100
    ).inputs["t"]


@pytest.mark.parametrize(
    ("datatype", "data", "needle"),
    [
        ("FP32", [1.0, None], "must be numbers"),
        ("FP32", ["1", 2.0], "must be numbers"),
        ("FP32", [True, False], "must be numbers"),
        ("FP16", [70000.0, 1.0], "overflow"),
        ("INT32", [1, None], "must be numbers"),
        ("INT32", [1.5, 2], "must be integers"),
        ("UINT8", [1, -1], "out of range"),
        ("INT8", [127, 128], "out of range"),
        ("INT64", [2**63, -1], "cannot be read as INT64"),
        ("UINT64", [2**64, 1], "cannot be read as UINT64"),
        ("BOOL", [True, None], "BOOL data must be true or false"),
        ("BOOL", [True, 1], "BOOL data must be true or false"),
    ],
)
def test_json_values_that_are_not_of_the_datatype_are_refused(
    datatype: str, data: list[object], needle: str
) -> None:
    with pytest.raises(RequestError, match=r"inputs\[0\]\.data: ") as caught:
        _decode(datatype, data)
    assert needle in str(caught.value)


def test_json_numbers_keep_their_value_and_nesting() -> None:
    assert _decode("INT32", [1.0, -2.0]).tolist() == [1, -2]  # integral floats are integers
    assert _decode("FP64", [1, 2**53 + 1]).tolist() == [1.0, float(2**53 + 1)]
    assert _decode("UINT64", [2**64 - 1, 0]).tolist() == [2**64 - 1, 0]
    nested = _decode("FP32", [[1, 2.5], [3, 4]], shape=[2, 2])
    assert nested.dtype == np.float32 and nested.tolist() == [[1.0, 2.5], [3.0, 4.0]]
    assert _decode("BOOL", [[True], [False]], shape=[2, 1]).tolist() == [[True], [False]]
    assert _decode("FP32", [], shape=[0, 3]).shape == (0, 3)


def test_binary_data_output_must_be_a_boolean() -> None:
    tensor = {"name": "t", "shape": [1], "datatype": "FP32", "data": [1.0]}
    body = {"inputs": [tensor], "parameters": {"binary_data_output": "false"}}
    with pytest.raises(
        RequestError, match=r"^parameters\.binary_data_output: must be true or false"
    ):
        decode_request(json.dumps(body).encode(), None, None, max_elements=10)
