"""The framing between the agent and a Python step's worker process.

One frame: 8-byte little-endian length, then a 4-byte little-endian header length, a JSON
header, and the tensors' bytes in header order. BYTES elements are each a 4-byte
little-endian length and the bytes (the V2 binary extension's layout). No pickle: the agent
must not unpickle what code it does not trust sends back.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

from runtimes.datatypes import from_numpy, numpy_dtype

Arrays = dict[str, np.ndarray]
LENGTH = struct.Struct("<Q")
MAX_FRAME_BYTES = 256 * 2**20
"""Largest frame the agent reads from a worker: the worker is not trusted to size its own."""


class FrameError(ValueError):
    """A frame that does not parse."""


def encode(tensors: Arrays | None = None, *, error: str | None = None) -> bytes:
    header: dict[str, Any] = {}
    chunks: list[bytes] = []
    if error is not None:
        header["error"] = error
    else:
        listed = []
        for name, array in (tensors or {}).items():
            datatype = from_numpy(array.dtype)
            if datatype == "BYTES":
                data = b"".join(
                    struct.pack("<I", len(x)) + x for x in (_as_bytes(v) for v in array.reshape(-1))
                )
            else:
                data = np.ascontiguousarray(array).tobytes()
            listed.append([name, datatype, list(array.shape), len(data)])
            chunks.append(data)
        header["tensors"] = listed
    head = json.dumps(header).encode()
    payload = struct.pack("<I", len(head)) + head + b"".join(chunks)
    return LENGTH.pack(len(payload)) + payload


def decode(payload: bytes) -> tuple[Arrays, str | None]:
    """The tensors of a frame's payload, or the error it carries.

    Raises:
        FrameError: the payload is malformed.
    """
    try:
        (head_length,) = struct.unpack_from("<I", payload)
        header = json.loads(payload[4 : 4 + head_length])
        if "error" in header:
            return {}, str(header["error"])
        offset = 4 + head_length
        tensors: Arrays = {}
        for name, datatype, shape, size in header["tensors"]:
            chunk = payload[offset : offset + size]
            offset += size
            if len(chunk) != size:
                raise FrameError(f"tensor {name!r} is cut short")
            if not all(isinstance(d, int) and d >= 0 for d in shape):
                raise FrameError(f"tensor {name!r} has shape {shape}")
            count = math.prod(shape)
            if datatype == "BYTES" and count * 4 > size:  # 4 bytes of length per element
                raise FrameError(f"tensor {name!r}: {count} elements in {size} bytes")
            if datatype == "BYTES":
                tensors[name] = _bytes_array(chunk, count).reshape(shape)
            else:
                tensors[name] = np.frombuffer(chunk, dtype=numpy_dtype(datatype)).reshape(shape)
        return tensors, None
    except (struct.error, KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise FrameError(f"malformed frame: {exc}") from exc


def _bytes_array(chunk: bytes, count: int) -> np.ndarray:
    out = np.empty(count, dtype=object)
    pos = 0
    for i in range(count):
        (length,) = struct.unpack_from("<I", chunk, pos)
        out[i] = chunk[pos + 4 : pos + 4 + length]
        pos += 4 + length
    return out


def _as_bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
