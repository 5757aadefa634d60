"""V2 and TF Serving codecs on their own: every V2 datatype both ways, JSON and binary."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agent.api.v2_codec import classify, decode_request, encode_response
from agent.errors import RequestError
from runtimes.datatypes import numpy_dtype

SAMPLES = {
    "BOOL": [True, False, True, True],
    "UINT8": [0, 1, 254, 255], "UINT16": [0, 1, 65534, 65535], "UINT32": [0, 1, 2**32 - 2, 2**32 - 1],
    "UINT64": [0, 1, 2**63, 2**64 - 1], "INT8": [-128, -1, 0, 127], "INT16": [-32768, -1, 0, 32767],
    "INT32": [-(2**31), -1, 0, 2**31 - 1], "INT64": [-(2**63), -1, 0, 2**63 - 1],
    "FP16": [0.5, -1.25, 2.0, 65504.0], "FP32": [0.1, -2.5, 3.4e38, 1e-38], "FP64": [0.1, -2.5, 1e308, 5e-324],
    "BYTES": ["a", "", "ünïcode", "x" * 100],
}  # fmt: skip


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
