"""``ModelInferRequest`` -> numpy and numpy -> ``ModelInferResponse``.

Inputs come from typed ``contents``, from ``raw_input_contents`` (one entry per input without
contents or shared memory, in order) or from a registered shared memory region. Outputs go
into ``raw_output_contents``, or into the region a requested output names; outputs in shared
memory are listed after the others, since tritonclient pairs the n-th output with the n-th raw
entry. NOTE: rules as Triton's (src/grpc/infer_handler.cc): raw and typed contents in one
request is an error, a raw entry left over is an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.errors import RequestError
from agent.grpc.proto import grpc_service_pb2 as pb
from agent.serving.classification import classify  # REST's too, so both rank alike
from agent.shm import tensors
from agent.shm.regions import Lease
from agent.shm.tensors import bytes_elements, to_raw
from runtimes.datatypes import ELEMENT_SIZE, V2_DATATYPES, from_numpy, numpy_dtype

Arrays = dict[str, np.ndarray]
_MAX_DIMS = 32
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""The typed field of ``InferTensorContents`` for each datatype (FP16 has none: raw only)."""
_LITTLE = {d: numpy_dtype(d).newbyteorder("<") for d in ELEMENT_SIZE if d != "BF16"}
_UNSUPPORTED = ("sequence_id", "sequence_start", "sequence_end")


@dataclass(slots=True)
class OutputSpec:
    name: str
    classification: int = 0
    region: tensors.RegionRef | None = None


@dataclass(slots=True)
class Decoded:
    inputs: Arrays
    outputs: list[OutputSpec] | None
    priority: int
    timeout_us: int | None


def _fail(where: str, message: str) -> RequestError:
    return RequestError(f"{where}: {message}", field=where)


def param(p: pb.InferParameter) -> Any:
    """The value of an ``InferParameter``, whichever field is set."""
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def _int_param(params: Any, key: str, where: str) -> int | None:
    if key not in params:
        return None
    value = param(params[key])
    if type(value) is not int or value < 0:
        raise _fail(f"{where}.parameters.{key}", "must be a non-negative integer")
    return value


def decode(request: pb.ModelInferRequest, lease: Lease, max_elements: int) -> Decoded:
    """The inputs, the outputs asked for and the request's parameters, checked."""
    if not request.inputs:
        raise _fail("inputs", "must hold at least one tensor")
    raw = request.raw_input_contents
    if raw and any(t.HasField("contents") for t in request.inputs):
        raise _fail("raw_input_contents", "give raw_input_contents or contents, not both")
    inputs: Arrays = {}
    used = 0
    for i, tensor in enumerate(request.inputs):
        where = f"inputs[{i}]"
        if not tensor.name:
            raise _fail(f"{where}.name", "must not be empty")
        if tensor.name in inputs:
            raise _fail(f"{where}.name", f"input {tensor.name!r} is given twice")
        shape, datatype = _check_tensor(tensor, where, max_elements)
        ref = _region(tensor, where)
        if ref is not None:
            if tensor.HasField("contents"):
                raise _fail(
                    f"{where}.contents", "give contents or a shared memory region, not both"
                )
            data = tensors.read(lease, ref, datatype, shape)
        elif tensor.HasField("contents"):
            data = _from_contents(tensor.contents, datatype, shape, where)
        else:
            if used >= len(raw):
                raise _fail(where, f"unable to find data for input tensor {tensor.name!r}")
            data = _from_raw(raw[used], datatype, shape, where)
            used += 1
        inputs[tensor.name] = data
    if used != len(raw):
        raise _fail("raw_input_contents", f"{len(raw) - used} entries are not claimed by an input")
    for key in _UNSUPPORTED:
        if key in request.parameters:
            raise _fail(f"parameters.{key}", "sequence batching is not supported")
    priority = _int_param(request.parameters, "priority", "request") or 0
    timeout = _int_param(request.parameters, "timeout", "request")
    return Decoded(inputs, _outputs(request, lease), priority, timeout)


def _check_tensor(tensor: Any, where: str, max_elements: int) -> tuple[list[int], str]:
    shape = list(tensor.shape)
    if len(shape) > _MAX_DIMS or any(d < 0 for d in shape):
        raise _fail(f"{where}.shape", f"must be at most {_MAX_DIMS} non-negative dimensions")
    if max(shape, default=0) > max_elements or math.prod(shape) > max_elements:
        raise _fail(
            f"{where}.shape",
            f"{shape} exceeds the limit of {max_elements} elements (max_tensor_elements)",
        )
    datatype = tensor.datatype
    if datatype not in V2_DATATYPES or datatype == "BF16":
        raise _fail(f"{where}.datatype", f"{datatype!r} is not a datatype this server takes")
    return shape, datatype


def _from_raw(raw: bytes, datatype: str, shape: list[int], where: str) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        return bytes_elements(memoryview(raw), count, where).reshape(shape)
    expected = count * ELEMENT_SIZE[datatype]
    if len(raw) != expected:
        raise _fail(
            where,
            f"input byte size mismatch for {datatype} {shape}: expected {expected}, got {len(raw)}",
        )
    return np.frombuffer(raw, dtype=_LITTLE[datatype]).reshape(shape)


def _from_contents(contents: Any, datatype: str, shape: list[int], where: str) -> np.ndarray:
    field_name = _CONTENTS.get(datatype)
    if field_name is None:
        raise _fail(f"{where}.contents", f"{datatype} data must come as raw_input_contents")
    values = getattr(contents, field_name)
    count = math.prod(shape)
    if len(values) != count:
        raise _fail(
            f"{where}.contents",
            f"has {len(values)} {field_name} values, shape {shape} needs {count}",
        )
    if datatype == "BYTES":
        return np.array(list(values), dtype=object).reshape(shape)
    target = numpy_dtype(datatype)
    array = np.array(values, dtype=np.int64 if target.kind in "iu" else target)
    if target.kind in "iu" and array.size:
        info = np.iinfo(target.type)  # type: ignore[type-var]  # int32 fields hold INT8/INT16 and their unsigned kin
        if array.min() < info.min or array.max() > info.max:
            raise _fail(f"{where}.contents", f"a value is out of range for {datatype}")
    return array.astype(target, copy=False).reshape(shape)


def _region(tensor: Any, where: str) -> tensors.RegionRef | None:
    """The region a tensor's parameters name (None if none), read as plain values."""
    if tensors.REGION not in tensor.parameters:
        return None
    keys = (tensors.REGION, tensors.BYTE_SIZE, tensors.OFFSET)
    return tensors.region_ref(
        {k: param(tensor.parameters[k]) for k in keys if k in tensor.parameters}, where
    )


def _outputs(request: pb.ModelInferRequest, lease: Lease) -> list[OutputSpec] | None:
    if not request.outputs:
        return None
    specs = []
    for i, out in enumerate(request.outputs):
        where = f"outputs[{i}]"
        ref = _region(out, where)
        if ref is not None:  # checked now, before the request runs
            tensors.claim(lease, ref)
        classes = _int_param(out.parameters, "classification", where) or 0
        specs.append(OutputSpec(out.name, classes, ref))
    return specs


def encode(
    model: str,
    version: str,
    request_id: str,
    outputs: Arrays,
    specs: list[OutputSpec] | None,
    lease: Lease,
) -> pb.ModelInferResponse:
    """The response; outputs asked for in a region are written there. As Triton's server
    does, every output has its entry in ``raw_output_contents``, in order, empty for one in a
    region: Triton's C++ client indexes that list by output (and crashed without them)."""
    response = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id)
    wanted = specs or [OutputSpec(name) for name in outputs]
    arrays = []
    for spec in wanted:
        array = outputs[spec.name]
        arrays.append(classify(array, spec.classification) if spec.classification else array)
    lease.check()  # a region taken away while the request ran fails it, inputs' too
    for spec, array in zip(wanted, arrays, strict=True):
        if spec.region is None:
            datatype = from_numpy(array.dtype)
            response.outputs.add(name=spec.name, datatype=datatype, shape=array.shape)
            response.raw_output_contents.append(to_raw(array, datatype))
            continue
        datatype, size = tensors.write(lease, spec.region, array)
        tensor = response.outputs.add(name=spec.name, datatype=datatype, shape=array.shape)
        tensor.parameters[tensors.REGION].string_param = spec.region.name
        tensor.parameters[tensors.BYTE_SIZE].int64_param = size
        if spec.region.offset:
            tensor.parameters[tensors.OFFSET].int64_param = spec.region.offset
        response.raw_output_contents.append(b"")
    return response
