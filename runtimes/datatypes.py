"""Tensor datatypes: the KServe V2 names are the project's vocabulary.

Backends describe types in their own terms (ONNX ``tensor(float)``, OpenVINO ``f32``,
numpy ``float32``); each maps to a V2 datatype here so signatures compare across backends.
NOTE: V2 datatype table: https://github.com/kserve/open-inference-protocol (inference_rest.md).
"""

from __future__ import annotations

import numpy as np

# V2 datatype -> numpy dtype. BYTES tensors are numpy object arrays holding ``bytes``.
_V2_TO_NUMPY: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
_NUMPY_TO_V2 = {dtype: name for name, dtype in _V2_TO_NUMPY.items()}

V2_DATATYPES: frozenset[str] = frozenset(_V2_TO_NUMPY) | {"BF16"}

_ONNX_TO_V2 = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(bfloat16)": "BF16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}

_OPENVINO_TO_V2 = {
    "boolean": "BOOL",
    "u8": "UINT8",
    "u16": "UINT16",
    "u32": "UINT32",
    "u64": "UINT64",
    "i8": "INT8",
    "i16": "INT16",
    "i32": "INT32",
    "i64": "INT64",
    "f16": "FP16",
    "bf16": "BF16",
    "f32": "FP32",
    "f64": "FP64",
    "string": "BYTES",
}

# Sizes in bytes of one element, for the binary tensor extension; BYTES is variable.
ELEMENT_SIZE: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "BF16": 2,
    "FP32": 4,
    "FP64": 8,
}


def numpy_dtype(datatype: str) -> np.dtype[np.generic]:
    """The numpy dtype for a V2 datatype; ``KeyError`` names the unknown type."""
    try:
        return _V2_TO_NUMPY[datatype]
    except KeyError:
        raise KeyError(f"datatype {datatype!r} has no numpy equivalent") from None


def from_numpy(dtype: np.dtype[np.generic]) -> str:
    """The V2 datatype of a numpy dtype (object and string arrays are BYTES)."""
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    try:
        return _NUMPY_TO_V2[np.dtype(dtype)]
    except KeyError:
        raise KeyError(f"numpy dtype {dtype} has no V2 datatype") from None


def from_onnx(type_name: str) -> str:
    """The V2 datatype of an ONNX Runtime type string such as ``tensor(float)``."""
    try:
        return _ONNX_TO_V2[type_name]
    except KeyError:
        raise KeyError(f"ONNX type {type_name!r} has no V2 datatype") from None


def from_openvino(type_name: str) -> str:
    """The V2 datatype of an OpenVINO element type name such as ``f32``."""
    try:
        return _OPENVINO_TO_V2[type_name]
    except KeyError:
        raise KeyError(f"OpenVINO element type {type_name!r} has no V2 datatype") from None
