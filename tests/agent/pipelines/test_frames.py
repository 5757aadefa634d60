"""The framing with a Python step's worker: what comes back is parsed, never unpickled, and a
frame that lies about its tensors is refused without allocating what it claims."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from agent.pipelines import frames


def _payload(header: dict[str, object], data: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("<I", len(head)) + head + data


def test_tensors_and_errors_round_trip() -> None:
    images = np.array([b"\xff\xd8jpeg", b""], dtype=object)
    floats = np.arange(6, dtype=np.float32).reshape(2, 3)
    encoded = frames.encode({"images": images, "floats": floats})
    tensors, error = frames.decode(encoded[frames.LENGTH.size :])
    assert error is None
    assert tensors["images"].tolist() == images.tolist()
    np.testing.assert_array_equal(tensors["floats"], floats)
    assert frames.decode(frames.encode(error="ValueError: no")[8:]) == ({}, "ValueError: no")


@pytest.mark.parametrize(
    "payload",
    [
        _payload({"tensors": [["x", "BYTES", [10**12], 8]]}, b"\0" * 8),  # a huge count
        _payload({"tensors": [["x", "FP32", [10**12], 8]]}, b"\0" * 8),
        _payload({"tensors": [["x", "FP32", [-1], 8]]}, b"\0" * 8),
        _payload({"tensors": [["x", "FP32", [4], 16]]}, b"\0" * 8),  # cut short
        _payload({"tensors": [["x", "PICKLE", [1], 1]]}, b"\0"),
        b"\x05\0\0\0{oops",
    ],
)
def test_a_lying_frame_is_refused(payload: bytes) -> None:
    with pytest.raises(frames.FrameError):
        frames.decode(payload)
