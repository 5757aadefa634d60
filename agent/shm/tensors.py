"""Tensors in registered regions: what gRPC's and REST's infer requests share.

A request names a region per input or output with three parameters, as Triton's:
``shared_memory_region``, ``shared_memory_byte_size`` and ``shared_memory_offset``. The
transports read them into a :class:`RegionRef` (:func:`region_ref`) and leave the rest here:
an input is copied out of its region when the request is decoded (:func:`read`), an output's
range is checked before the request runs (:func:`claim`) and written once, straight from the
output, after it (:func:`write`). Neither maps the object (see :mod:`agent.shm.regions`).
NOTE: spec: https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_shared_memory.md
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.errors import RequestError
from agent.shm.regions import Lease, as_array
from runtimes.datatypes import ELEMENT_SIZE, from_numpy, numpy_dtype

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
_LE_LENGTH = struct.Struct("<I")
_LITTLE = {d: numpy_dtype(d).newbyteorder("<") for d in ELEMENT_SIZE if d != "BF16"}


@dataclass(frozen=True, slots=True)
class RegionRef:
    """A tensor's place in a region, as its request named it; ``where`` is the tensor's path
    in the request (``inputs[0]``), for errors."""

    name: str
    byte_size: int
    offset: int
    where: str

    @property
    def region_field(self) -> str:
        return f"{self.where}.parameters.{REGION}"

    @property
    def size_field(self) -> str:
        return f"{self.where}.parameters.{BYTE_SIZE}"


def _fail(where: str, message: str) -> RequestError:
    return RequestError(f"{where}: {message}", field=where)


def region_ref(params: Mapping[str, Any], where: str) -> RegionRef | None:
    """The region a tensor's parameters (already plain values) name, None if none."""
    if REGION not in params:
        return None
    name = params[REGION]
    if not isinstance(name, str) or not name:
        raise _fail(f"{where}.parameters.{REGION}", "must be a region's name")
    size = params.get(BYTE_SIZE)
    if size is None:
        raise _fail(f"{where}.parameters.{BYTE_SIZE}", "is required with a region")
    offset = params.get(OFFSET, 0)
    for key, value in ((BYTE_SIZE, size), (OFFSET, offset)):
        if type(value) is not int or value < 0:
            raise _fail(f"{where}.parameters.{key}", "must be a non-negative integer")
    return RegionRef(name, size, offset, where)


def read(lease: Lease, ref: RegionRef, datatype: str, shape: list[int]) -> np.ndarray:
    """An input of ``datatype`` and ``shape``, copied out of its region: its owner may change
    or truncate the object later without touching the request."""
    region = lease.take(ref.name, ref.region_field)
    if datatype != "BYTES":
        expected = math.prod(shape) * ELEMENT_SIZE[datatype]
        if ref.byte_size != expected:
            raise _fail(
                ref.size_field,
                f"input byte size mismatch for {datatype} {shape}: expected {expected}, "
                f"got {ref.byte_size}",
            )
    data = region.read(ref.offset, ref.byte_size, ref.size_field)
    if datatype == "BYTES":
        return bytes_elements(data, math.prod(shape), ref.where).reshape(shape)
    return as_array(data, _LITTLE[datatype], shape)


def claim(lease: Lease, ref: RegionRef) -> None:
    """Check, before the request runs, that the region is there and holds the range."""
    lease.take(ref.name, ref.region_field).place(ref.offset, ref.byte_size, ref.size_field)


def write(lease: Lease, ref: RegionRef, array: np.ndarray) -> tuple[str, int]:
    """Write an output into its region; its datatype and the bytes written.

    Raises:
        RegionGoneError: a region of the request was unregistered while it ran.
        RequestError: the output does not fit in the range the request gave it.
    """
    lease.check()
    datatype = from_numpy(array.dtype)
    raw = to_raw(array, datatype) if datatype == "BYTES" else None
    size = array.nbytes if raw is None else len(raw)
    if size > ref.byte_size:
        raise _fail(ref.size_field, f"output of {size} bytes does not fit in {ref.byte_size}")
    region = lease.take(ref.name, ref.region_field)
    if raw is None:  # straight from the output into the region: one copy
        little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        region.write(ref.offset, little.data, ref.size_field)
    else:
        region.write(ref.offset, memoryview(raw), ref.size_field)
    return datatype, size


def bytes_elements(raw: memoryview, count: int, where: str) -> np.ndarray:
    """BYTES elements (a 4-byte little-endian length, then the bytes), ``count`` of them."""
    items, pos = [], 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise _fail(where, "a BYTES element is cut short in its 4-byte length")
        (length,) = _LE_LENGTH.unpack_from(raw, pos)
        if pos + 4 + length > len(raw):
            raise _fail(where, f"a BYTES element of {length} bytes runs past the tensor's data")
        items.append(bytes(raw[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    if len(items) != count:
        raise _fail(where, f"holds {len(items)} BYTES elements, the shape needs {count}")
    return np.array(items, dtype=object)


def to_raw(array: np.ndarray, datatype: str) -> bytes:
    """A tensor's raw bytes: little-endian, row-major; BYTES as 4-byte length + bytes."""
    if datatype == "BYTES":
        parts = []
        for x in array.reshape(-1):
            data = x if isinstance(x, bytes) else str(x).encode()
            parts.append(_LE_LENGTH.pack(len(data)) + data)
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
