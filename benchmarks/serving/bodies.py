"""The request bodies every system receives: identical bytes for the same kind."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from benchmarks.serving.serving import binary_request

SHAPES = {"mlp": (1, 256), "cnn": (1, 3, 224, 224)}


@dataclass(frozen=True)
class Bodies:
    row: np.ndarray
    json: tuple[bytes, list[str]]
    """V2 JSON, flat data: what every system accepts."""
    binary: tuple[bytes, list[str]]
    """V2 with Triton's binary tensor extension, binary output requested."""


def make_bodies(model: str) -> Bodies:
    """One row of ``model``'s input, rounded to 4 decimals so the JSON is what a client
    would send, not 17-digit floats."""
    row = np.random.default_rng(0).standard_normal(SHAPES[model]).round(4).astype(np.float32)
    doc = {
        "inputs": [
            {
                "name": "input",
                "shape": list(row.shape),
                "datatype": "FP32",
                "data": [round(float(v), 4) for v in row.ravel()],
            }
        ]
    }
    return Bodies(
        row=row,
        json=(json.dumps(doc, separators=(",", ":")).encode(), ["Content-Type: application/json"]),
        binary=binary_request(row),
    )
