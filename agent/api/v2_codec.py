"""KServe V2 / Open Inference Protocol REST bodies <-> numpy, with Triton's binary extension.

The request is parsed by hand rather than by a pydantic model: tensors of tens of thousands
of numbers would cost more to validate element by element than the inference itself. Every
error names the JSON path of the offending field (``inputs[0].shape``).
NOTE: binary extension spec:
https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_binary_data.md
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import orjson

from agent.errors import BadJsonError, NullValueError, RequestError
from agent.serving.classification import UNCLASSIFIABLE, classify
from agent.shm import tensors
from agent.shm.regions import Lease
from runtimes.datatypes import ELEMENT_SIZE, V2_DATATYPES, from_numpy, numpy_dtype
from runtimes.signature import ModelSignature

Arrays = dict[str, np.ndarray]
_LE_LENGTH = struct.Struct("<I")
MAX_DIMS = 64 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 32
"""The most dimensions numpy gives an array (NPY_MAXDIMS: 32 before numpy 2)."""
_LITTLE_ENDIAN = {d: numpy_dtype(d).newbyteorder("<") for d in ELEMENT_SIZE if d != "BF16"}
"""The numpy dtype of every fixed-size V2 datatype, little-endian as the binary extension is."""


@dataclass
class RequestedOutput:
    name: str
    binary: bool | None = None
    classification: int = 0
    region: tensors.RegionRef | None = None
    """The shared memory region the output is written into (then the response carries its
    metadata and the region's parameters, and no data)."""


Written = Mapping[str, tuple[str, list[int], int]]
"""Outputs written into regions: name -> (datatype, shape, bytes written)."""


@dataclass
class DecodedRequest:
    id: str | None
    inputs: Arrays
    outputs: list[RequestedOutput] | None
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def binary_output_default(self) -> bool:
        return self.parameters.get("binary_data_output", False) is True  # checked at decoding


class NullInData(ValueError):
    """:func:`json_array`'s error when what is not a value of the datatype is null."""


def _fail(field: str, message: str) -> RequestError:
    return RequestError(f"{field}: {message}", field=field)


def decode_request(
    body: bytes,
    header_length: int | None,
    signature: ModelSignature | None,
    *,
    max_elements: int,
    lease: Lease | None = None,
) -> DecodedRequest:
    """Parse a V2 inference request (JSON, JSON + binary tensors, or one raw binary tensor).

    Tensors in shared memory regions are taken into ``lease`` (None: this agent serves no
    shared memory, and a request naming a region is refused); inputs there are views of the
    region, without a copy.
    """
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise _fail(
                "Inference-Header-Content-Length",
                f"{header_length} is outside the body of {len(body)} bytes",
            )
        if header_length == 0:
            return _decode_raw(body, signature, max_elements)
        head, binary = body[:header_length], memoryview(body)[header_length:]
    else:
        head, binary = body, memoryview(b"")
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise BadJsonError(f"body: not valid JSON ({exc})", field="body") from None
    if not isinstance(doc, dict):
        raise _fail("body", "must be a JSON object")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _fail("id", "must be a string")
    parameters = _parameters(doc.get("parameters"), "parameters")
    if not isinstance(parameters.get("binary_data_output", False), bool):
        # "false" is a non-empty string: it must not read as true
        raise _fail("parameters.binary_data_output", "must be true or false")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise _fail("inputs", "must be a non-empty list of tensors")
    inputs: Arrays = {}
    offset = 0
    for i, item in enumerate(raw_inputs):
        where = f"inputs[{i}]"
        name, array, used = _decode_input(item, where, binary, offset, max_elements, lease)
        if name in inputs:
            raise _fail(f"inputs[{i}].name", f"input {name!r} is given twice")
        inputs[name] = array
        offset += used
    if offset != len(binary):
        raise _fail(
            "body",
            f"{len(binary) - offset} bytes of binary data are not claimed by any "
            "input's parameters.binary_data_size",
        )
    outputs = _requested_outputs(doc.get("outputs"), lease)
    return DecodedRequest(request_id, inputs, outputs, parameters)


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(where, "must be an object")
    return value


def _shape(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(type(d) is int and d >= 0 for d in value):
        raise _fail(where, "must be a list of non-negative integers")
    if len(value) > MAX_DIMS:
        raise _fail(where, f"has {len(value)} dimensions; at most {MAX_DIMS} are supported")
    return value


def _decode_input(
    item: Any, where: str, binary: memoryview, offset: int, max_elements: int, lease: Lease | None
) -> tuple[str, np.ndarray, int]:
    if not isinstance(item, dict):
        raise _fail(where, "must be an object with name, shape, datatype and data")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(f"{where}.name", "must be a non-empty string")
    shape = _shape(item.get("shape"), f"{where}.shape")
    datatype = item.get("datatype")
    if not isinstance(datatype, str) or datatype not in V2_DATATYPES:
        raise _fail(
            f"{where}.datatype",
            f"{datatype!r} is not a V2 datatype ({', '.join(sorted(V2_DATATYPES))})",
        )
    if datatype == "BF16":
        raise _fail(f"{where}.datatype", "BF16 tensors are not supported by this server")
    count = math.prod(shape)
    if count > max_elements:
        raise _fail(
            f"{where}.shape",
            f"{count} elements exceed the limit of {max_elements} (max_tensor_elements)",
        )
    if max(shape, default=0) > max_elements:
        # a zero elsewhere keeps the count small, but numpy cannot even shape [0, 10**20]
        raise _fail(
            f"{where}.shape",
            f"dimension {max(shape)} exceeds the limit of {max_elements} (max_tensor_elements)",
        )
    params = _parameters(item.get("parameters"), f"{where}.parameters")
    ref = _region(params, where, lease)
    if ref is not None:
        if "data" in item or "binary_data_size" in params:
            raise _fail(f"{where}.data", "give data or a shared memory region, not both")
        return name, tensors.read(_held(lease), ref, datatype, shape), 0
    size = params.get("binary_data_size")
    if size is not None:
        if type(size) is not int or size < 0:
            raise _fail(f"{where}.parameters.binary_data_size", "must be a non-negative integer")
        if "data" in item:
            raise _fail(f"{where}.data", "give data or parameters.binary_data_size, not both")
        if offset + size > len(binary):
            raise _fail(
                f"{where}.parameters.binary_data_size",
                f"{size} bytes claimed but only {len(binary) - offset} remain in the body",
            )
        chunk = binary[offset : offset + size]
        return (
            name,
            _from_binary(chunk, datatype, shape, f"{where}.parameters.binary_data_size"),
            size,
        )
    if "data" not in item:
        raise _fail(f"{where}.data", "is missing (or give parameters.binary_data_size)")
    return name, _from_json(item["data"], datatype, shape, f"{where}.data"), 0


def _region(params: dict[str, Any], where: str, lease: Lease | None) -> tensors.RegionRef | None:
    ref = tensors.region_ref(params, where)
    if ref is not None and lease is None:
        raise _fail(ref.region_field, "shared memory is not served by this agent")
    return ref


def _held(lease: Lease | None) -> Lease:
    assert lease is not None  # _region refuses a region without one
    return lease


def _from_json(data: Any, datatype: str, shape: list[int], where: str) -> np.ndarray:
    if not isinstance(data, list):
        data = [data]
    try:
        if datatype == "BYTES":
            flat = np.array(_flatten_bytes(data, where), dtype=object)
        else:
            flat = json_array(data, datatype).reshape(-1)
    except NullInData as exc:
        raise NullValueError(f"{where}: cannot be read as {datatype}: {exc}", field=where) from None
    except (ValueError, TypeError, OverflowError, FloatingPointError) as exc:
        raise _fail(where, f"cannot be read as {datatype}: {exc}") from None
    expected = math.prod(shape)
    if flat.size != expected:
        raise _fail(where, f"has {flat.size} values but shape {shape} needs {expected}")
    return flat.reshape(shape)


def json_array(values: Any, datatype: str) -> np.ndarray:
    """JSON numbers, or booleans for BOOL, in nested lists, as an array of a V2 datatype.

    numpy first reads the values with no type asked for, and the kind of array it makes tells
    in one vectorised look whether they were all numbers (or all booleans): reading them
    straight as the datatype would turn null into NaN, "1" into 1.0 and true into 1, and a
    check of each value in Python would cost more than the decoding (the JSON path is
    benchmarked). Numbers mixed with booleans still pass: numpy makes numbers of them.

    Raises:
        ValueError: the values are not of the datatype (the message says why), or ragged;
            :class:`NullInData` where null is among them.
        FloatingPointError: a value overflows the datatype.
    """
    parsed = np.asarray(values)
    kind = parsed.dtype.kind
    if datatype == "BOOL":
        if kind != "b" and parsed.size:
            raise _not_values(parsed, "BOOL data must be true or false")
        return parsed.astype(np.bool_, copy=False)
    if kind == "S" and parsed.size:  # only TF Serving's {"b64": ...} values decode to bytes
        raise ValueError(f"b64 values are for string inputs, not {datatype}")
    if kind not in "iuf" and parsed.size:  # b: true/false, U: strings, O: null or objects
        raise _not_values(parsed, "the values must be numbers, not null, strings or true/false")
    target = numpy_dtype(datatype)
    if target.kind in "iu" and parsed.size:
        if kind == "f":
            # Floats, or integers no one numpy integer type holds (UINT64 values from 2**63
            # next to small ones make float64): whole ones are read again as the datatype,
            # exactly, numpy refusing any out of its range.
            if not np.array_equal(parsed, np.trunc(parsed)):
                raise ValueError(f"{datatype} data must be integers")
            with np.errstate(over="raise", invalid="raise"):
                return np.asarray(values, dtype=target)
        if not np.can_cast(parsed.dtype, target):
            # a cast between integer types wraps silently (300 as UINT8 is 44)
            info = np.iinfo(cast("np.dtype[np.integer[Any]]", target))
            if parsed.min() < info.min or parsed.max() > info.max:
                raise ValueError(f"a value is out of range for {datatype} ({info.min}..{info.max})")
    # a number out of the datatype's range is refused, not turned into inf or garbage
    with np.errstate(over="raise", invalid="raise"):
        return parsed.astype(target, copy=False)


def _not_values(parsed: np.ndarray, message: str) -> ValueError:
    """The error for values not of the datatype: :class:`NullInData` if null is among them
    (only an array of Python objects can hold it)."""
    if parsed.dtype.kind == "O" and any(value is None for value in parsed.flat):
        return NullInData(message)
    return ValueError(message)


def _flatten_bytes(data: list[Any], where: str) -> list[bytes]:
    out: list[bytes] = []
    for x in data:
        if isinstance(x, list):
            out.extend(_flatten_bytes(x, where))
        elif isinstance(x, str):
            out.append(x.encode())
        elif x is None:
            raise NullValueError(f"{where}: BYTES data must be strings, got null", field=where)
        else:
            raise _fail(where, f"BYTES data must be strings, got {type(x).__name__}")
    return out


def _from_binary(chunk: memoryview, datatype: str, shape: list[int], where: str) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        items, pos, raw = [], 0, bytes(chunk)
        while pos < len(raw):
            if pos + 4 > len(raw):
                raise _fail(where, "BYTES element is cut short in its 4-byte length")
            (length,) = _LE_LENGTH.unpack_from(raw, pos)
            if pos + 4 + length > len(raw):
                raise _fail(where, f"BYTES element of {length} bytes runs past its tensor's data")
            items.append(raw[pos + 4 : pos + 4 + length])
            pos += 4 + length
        if len(items) != count:
            raise _fail(where, f"holds {len(items)} BYTES elements but shape {shape} needs {count}")
        return np.array(items, dtype=object).reshape(shape)
    expected = count * ELEMENT_SIZE[datatype]
    if len(chunk) != expected:
        raise _fail(
            where, f"is {len(chunk)} bytes but shape {shape} of {datatype} needs {expected}"
        )
    # The extension is little-endian; frombuffer views the request body without copying.
    dtype = _LITTLE_ENDIAN.get(datatype)
    if dtype is None:  # BF16: numpy has none (a KeyError, as before)
        dtype = numpy_dtype(datatype).newbyteorder("<")
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)


def _decode_raw(body: bytes, signature: ModelSignature | None, max_elements: int) -> DecodedRequest:
    """``Inference-Header-Content-Length: 0``: the body is the one input's raw bytes, batch 1."""
    if signature is None or len(signature.inputs) != 1:
        raise _fail(
            "Inference-Header-Content-Length",
            "a raw binary body needs a model with exactly one input",
        )
    spec = signature.inputs[0]
    dims = list(spec.shape)
    if spec.datatype == "BYTES":
        shape = [1]
    else:
        if spec.datatype not in ELEMENT_SIZE:
            raise _fail("body", f"raw binary input of {spec.datatype} is not supported")
        variable = [i for i, d in enumerate(dims) if d < 0]
        if signature.batched:
            dims[0], variable = 1, variable[1:]
        if len(variable) > 1:
            raise _fail("body", "a raw binary body needs at most one variable dimension")
        known = math.prod(d for d in dims if d >= 0) * ELEMENT_SIZE[spec.datatype]
        if variable:
            if known == 0 or len(body) % known:
                raise _fail(
                    "body", f"{len(body)} bytes do not fit input {spec.name!r} {spec.shape}"
                )
            dims[variable[0]] = len(body) // known
        shape = dims
    if math.prod(shape) > max_elements:
        raise _fail(
            "body",
            f"{math.prod(shape)} elements exceed the limit of {max_elements} (max_tensor_elements)",
        )
    array = _from_binary(memoryview(body), spec.datatype, shape, "body")
    return DecodedRequest(None, {spec.name: array}, None, {"binary_data_output": True})


def check_classification(
    requested: list[RequestedOutput] | None, signature: ModelSignature
) -> None:
    """Refuse, before inference, classification of an output that has no order to rank by.

    An output the model does not have is left to the inference service, which names it.
    """
    datatypes = {t.name: t.datatype for t in signature.outputs}
    for i, output in enumerate(requested or ()):
        datatype = datatypes.get(output.name)
        if output.classification and datatype in UNCLASSIFIABLE:
            raise _fail(
                f"outputs[{i}].parameters.classification",
                f"output {output.name!r} is {datatype}; classification ranks numeric outputs only",
            )


def _requested_outputs(value: Any, lease: Lease | None) -> list[RequestedOutput] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _fail("outputs", "must be a list")
    outputs = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise _fail(f"outputs[{i}]", "must be an object with a name")
        params = _parameters(item.get("parameters"), f"outputs[{i}].parameters")
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise _fail(f"outputs[{i}].parameters.binary_data", "must be true or false")
        classes = params.get("classification", 0)
        if type(classes) is not int or classes < 0:
            raise _fail(f"outputs[{i}].parameters.classification", "must be a non-negative integer")
        ref = _region(params, f"outputs[{i}]", lease)
        if ref is not None:  # checked now, before the request runs
            tensors.claim(_held(lease), ref)
        outputs.append(RequestedOutput(item["name"], binary, classes, ref))
    return outputs


# -- responses ---------------------------------------------------------------------------------


def encode_response(
    model: str,
    version: str,
    request_id: str | None,
    outputs: Arrays,
    requested: list[RequestedOutput] | None,
    binary_default: bool,
    written: Written | None = None,
) -> tuple[bytes, int | None]:
    """The response body and, when binary tensors follow the JSON, the JSON's length.

    An output ``written`` into its region is listed with its name, datatype and shape and no
    ``parameters``, as Triton answers it: Triton's C++ HTTP client reads ``binary_data_size``
    wherever ``parameters`` appears (perf_analyzer failed on the region's own parameters).
    """
    specs = requested or [RequestedOutput(name) for name in outputs]
    listed: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for spec in specs:
        if spec.region is not None:
            assert written is not None  # InferCall writes them before it responds
            datatype, shape, _ = written[spec.name]
            listed.append({"name": spec.name, "datatype": datatype, "shape": shape})
            continue
        array = outputs[spec.name]
        if spec.classification:
            array = classify(array, spec.classification)
        datatype = from_numpy(array.dtype)
        tensor: dict[str, Any] = {
            "name": spec.name,
            "datatype": datatype,
            "shape": list(array.shape),
        }
        binary = binary_default if spec.binary is None else spec.binary
        if binary:
            raw = _to_binary(array, datatype)
            tensor["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            tensor["data"] = _to_json_data(array, datatype)
        listed.append(tensor)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": listed}
    if request_id is not None:
        doc["id"] = request_id
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)


def _to_json_data(array: np.ndarray, datatype: str) -> Any:
    flat = array.reshape(-1)
    if datatype == "BYTES":
        try:
            return [x.decode() if isinstance(x, bytes) else str(x) for x in flat]
        except UnicodeDecodeError:
            raise RequestError(
                "outputs: a BYTES output is not UTF-8; ask for it with parameters.binary_data=true",
                field="outputs",
            ) from None
    if datatype == "FP16":
        return flat.astype(np.float32)
    return np.ascontiguousarray(flat)


def _to_binary(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        parts = []
        for x in array.reshape(-1):
            data = x if isinstance(x, bytes) else str(x).encode()
            parts.append(_LE_LENGTH.pack(len(data)) + data)
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
