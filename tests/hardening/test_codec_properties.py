"""Property tests of the wire codecs (agent/api/v2_codec.py, agent/api/tfserving_codec.py).

Round trips where the formats define one, and for everything else one property: any body, any
header value, any JSON document, any mutation of a valid request is either decoded or refused
with :class:`RequestError` (a 400 naming the field), never an IndexError, ValueError, KeyError
or TypeError leaking out as a 500.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agent.api.tfserving_codec import decode_predict, encode_predict
from agent.api.v2_codec import decode_request, encode_response
from agent.errors import RequestError
from runtimes.datatypes import numpy_dtype
from runtimes.signature import ModelSignature, TensorSpec

LIMIT = 100_000
DATATYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
]
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def tensors(draw: st.DrawFn, datatype: str | None = None) -> np.ndarray:
    datatype = datatype or draw(st.sampled_from(DATATYPES))
    shape = draw(SHAPES)
    if datatype == "BYTES":
        items = draw(
            st.lists(
                st.binary(max_size=8), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))
            )
        )
        return np.array(items, dtype=object).reshape(shape)
    dtype = numpy_dtype(datatype)
    # finite values only: JSON has no NaN or infinity
    elements = (
        st.floats(width=dtype.itemsize * 8, allow_nan=False, allow_infinity=False)
        if dtype.kind == "f"
        else None
    )
    return draw(hnp.arrays(dtype, shape, elements=elements))


def dumps(doc: Any) -> bytes:
    """Any JSON, big integers included (orjson stops at 64 bits; clients need not)."""
    return json.dumps(doc).encode()


def utf8_tensors() -> st.SearchStrategy[np.ndarray]:
    """BYTES tensors that JSON can carry (the JSON form holds strings)."""
    return tensors("BYTES").filter(lambda a: all(_is_utf8(x) for x in a.reshape(-1)))


def _is_utf8(x: bytes) -> bool:
    try:
        x.decode()
    except UnicodeDecodeError:
        return False
    return True


def as_request(response: bytes, json_length: int | None) -> tuple[bytes, int | None]:
    """A response's tensors sent back as a request's inputs (same binary parts, if any)."""
    head = response if json_length is None else response[:json_length]
    doc = orjson.loads(head)
    new_head = orjson.dumps({"inputs": doc["outputs"]})
    if json_length is None:
        return new_head, None
    return new_head + response[json_length:], len(new_head)


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == object:
        assert got.dtype == object and list(got.reshape(-1)) == list(want.reshape(-1))
    else:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


# -- V2: round trips -------------------------------------------------------------------------


@FAST
@given(st.one_of(tensors().filter(lambda a: a.dtype != object), utf8_tensors()), st.booleans())
def test_v2_json_round_trip_flat_and_nested(array: np.ndarray, nested: bool) -> None:
    datatype = "BYTES" if array.dtype == object else str(_v2(array))
    data: Any = array.tolist() if nested else array.reshape(-1).tolist()
    if datatype == "BYTES":
        data = _decode_strings(data)
    doc = {
        "inputs": [{"name": "x", "shape": list(array.shape), "datatype": datatype, "data": data}]
    }
    decoded = decode_request(orjson.dumps(doc), None, None, max_elements=LIMIT)
    assert_same(decoded.inputs["x"], array)


@FAST
@given(st.lists(tensors(), min_size=1, max_size=3), st.booleans())
def test_v2_response_decodes_back_to_the_same_tensors(
    arrays: list[np.ndarray], binary: bool
) -> None:
    if not binary:
        arrays = [a for a in arrays if a.dtype != object or all(_is_utf8(x) for x in a.flat)]
        if not arrays:
            return
    outputs = {f"t{i}": a for i, a in enumerate(arrays)}
    body, json_length = encode_response("m", "1", None, outputs, None, binary)
    request, header = as_request(body, json_length)
    decoded = decode_request(request, header, None, max_elements=LIMIT)
    for name, array in outputs.items():
        want = array.astype(np.float16) if array.dtype == np.float16 else array
        assert_same(decoded.inputs[name], want)


@FAST
@given(st.lists(st.binary(max_size=16), min_size=0, max_size=6))
def test_v2_binary_bytes_elements_round_trip(items: list[bytes]) -> None:
    raw = b"".join(struct.pack("<I", len(x)) + x for x in items)
    head = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "s",
                    "shape": [len(items)],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    decoded = decode_request(head + raw, len(head), None, max_elements=LIMIT)
    assert list(decoded.inputs["s"]) == items


# -- V2: malformed input is a RequestError, nothing else ---------------------------------------


def decodes_or_refuses(body: bytes, header: int | None, signature: ModelSignature | None) -> None:
    try:
        decode_request(body, header, signature, max_elements=LIMIT)
    except RequestError as exc:
        assert exc.field and str(exc).startswith(exc.field)


MLP = ModelSignature(
    inputs=(TensorSpec(name="input", datatype="FP32", shape=(-1, 256)),),
    outputs=(TensorSpec(name="logits", datatype="FP32", shape=(-1, 10)),),
)


@FAST
@given(st.binary(max_size=200), st.none() | st.integers(min_value=-5, max_value=250))
def test_v2_any_bytes_and_header_length(body: bytes, header: int | None) -> None:
    decodes_or_refuses(body, header, MLP)


@pytest.mark.slow
@FAST
@given(JSON)
def test_v2_any_json_document(doc: Any) -> None:
    decodes_or_refuses(dumps(doc), None, None)


@st.composite
def mutated_v2(draw: st.DrawFn) -> tuple[bytes, int | None]:
    """A valid request (JSON or binary) with one field replaced by arbitrary JSON."""
    array = draw(tensors())
    binary = (
        array.dtype == object and not all(_is_utf8(x) for x in array.flat) or draw(st.booleans())
    )
    body, length = encode_response("m", "1", None, {"x": array}, None, binary)
    request, header = as_request(body, length)
    head = request if header is None else request[:header]
    doc = orjson.loads(head)
    tensor = doc["inputs"][0]
    where = draw(
        st.sampled_from(
            [
                "name",
                "shape",
                "datatype",
                "data",
                "parameters",
                "shape_item",
                "binary_data_size",
                "top",
                "outputs",
                "id",
            ]
        )
    )
    value = draw(JSON | st.integers(min_value=-(2**70), max_value=2**70))
    if where == "shape_item" and tensor["shape"]:
        tensor["shape"][draw(st.integers(0, len(tensor["shape"]) - 1))] = value
    elif where == "binary_data_size":
        tensor.setdefault("parameters", {})["binary_data_size"] = value
    elif where == "top":
        doc = value
    elif where in ("outputs", "id"):
        doc[where] = value
    else:
        tensor[where] = value
    new_head = dumps(doc)
    if header is None:
        return new_head, None
    return new_head + request[header:], len(new_head)


@FAST
@given(mutated_v2())
def test_v2_mutated_requests(case: tuple[bytes, int | None]) -> None:
    decodes_or_refuses(*case, None)


@pytest.mark.parametrize(
    "shape",
    [[0, 10**20], [0, 2**63], [0, 2**64 + 1], [10**20, 0, 10**20]],
    ids=["huge-dim-1e20", "dim-2^63", "dim-2^64+1", "two-huge-dims"],
)
@pytest.mark.parametrize("form", ["json", "binary"])
def test_v2_empty_tensor_with_huge_dimension(shape: list[int], form: str) -> None:
    tensor: dict[str, Any] = {"name": "x", "shape": shape, "datatype": "FP32"}
    if form == "json":
        tensor["data"] = []
    else:
        tensor["parameters"] = {"binary_data_size": 0}
    body = dumps({"inputs": [tensor]})
    with pytest.raises(RequestError, match=r"inputs\[0\]\.shape"):
        decode_request(body, len(body) if form == "binary" else None, None, max_elements=LIMIT)


# -- TF Serving ------------------------------------------------------------------------------


@FAST
@given(
    st.lists(
        st.lists(
            st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=3, max_size=3
        ),
        min_size=1,
        max_size=5,
    ),
    st.booleans(),
)
def test_tf_row_and_columnar_round_trip(rows: list[list[float]], columnar: bool) -> None:
    sig = ModelSignature(
        inputs=(TensorSpec(name="x", datatype="FP32", shape=(-1, 3)),),
        outputs=(TensorSpec(name="y", datatype="FP32", shape=(-1, 3)),),
    )
    key = "inputs" if columnar else "instances"
    inputs, is_rows = decode_predict(orjson.dumps({key: rows}), sig, max_elements=LIMIT)
    assert is_rows is not columnar
    want = np.asarray(rows, dtype=np.float32)
    assert_same(inputs["x"], want)
    out = orjson.loads(encode_predict({"y": inputs["x"]}, is_rows))
    assert np.asarray(out["predictions" if is_rows else "outputs"], np.float32).tolist() == (
        want.tolist()
    )


TWO = ModelSignature(
    inputs=(
        TensorSpec(name="a", datatype="INT64", shape=(-1,)),
        TensorSpec(name="s", datatype="BYTES", shape=(-1,)),
    ),
    outputs=(TensorSpec(name="o_bytes", datatype="BYTES", shape=(-1,)),),
)


@FAST
@given(
    st.lists(
        st.tuples(st.integers(-(2**63), 2**63 - 1), st.binary(max_size=12)), min_size=1, max_size=5
    ),
    st.booleans(),
)
def test_tf_named_rows_and_columns_with_b64_round_trip(
    rows: list[tuple[int, bytes]], columnar: bool
) -> None:
    b64 = [{"b64": base64.b64encode(s).decode()} for _, s in rows]
    if columnar:
        doc: Any = {"inputs": {"a": [a for a, _ in rows], "s": b64}}
    else:
        doc = {"instances": [{"a": a, "s": s} for (a, _), s in zip(rows, b64, strict=True)]}
    inputs, _ = decode_predict(orjson.dumps(doc), TWO, max_elements=LIMIT)
    assert inputs["a"].tolist() == [a for a, _ in rows]
    assert list(inputs["s"]) == [s for _, s in rows]
    # *_bytes outputs go back as b64 whatever they hold
    back = orjson.loads(encode_predict({"o_bytes": inputs["s"]}, rows=not columnar))
    values = back["predictions" if not columnar else "outputs"]
    assert [base64.b64decode(v["b64"]) for v in values] == [s for _, s in rows]


def predicts_or_refuses(body: bytes, signature: ModelSignature) -> None:
    try:
        decode_predict(body, signature, max_elements=LIMIT)
    except RequestError as exc:
        assert exc.field and str(exc).startswith(exc.field)


B64 = st.builds(lambda v: {"b64": v}, st.text(max_size=8) | JSON)


@FAST
@given(st.binary(max_size=200) | st.builds(dumps, JSON))
def test_tf_any_body(body: bytes) -> None:
    predicts_or_refuses(body, TWO)
    predicts_or_refuses(body, MLP)


@FAST
@given(
    st.sampled_from(["instances", "inputs"]),
    st.recursive(
        JSON | B64,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.sampled_from(["a", "s", "b64", "x"]), inner, max_size=3)
        ),
        max_leaves=12,
    ),
)
def test_tf_any_instances_or_inputs(key: str, value: Any) -> None:
    for sig in (TWO, MLP):
        predicts_or_refuses(dumps({key: value}), sig)


@pytest.mark.parametrize("value", ["é", "\x00\xff", "QUJD\u00e9", "====", "A"])
def test_tf_b64_that_is_not_base64_is_400(value: str) -> None:
    body = orjson.dumps({"instances": [{"a": 1, "s": {"b64": value}}]})
    with pytest.raises(RequestError, match=r"instances\[0\]\.s\.b64: is not valid base64"):
        decode_predict(body, TWO, max_elements=LIMIT)


def _v2(array: np.ndarray) -> str:
    from runtimes.datatypes import from_numpy

    return from_numpy(array.dtype)


def _decode_strings(data: Any) -> Any:
    if isinstance(data, list):
        return [_decode_strings(x) for x in data]
    return data.decode()
