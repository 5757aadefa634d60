"""Pipeline fixtures: the example ``classifier`` and JPEGs made with Pillow."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def jpeg(width: int, height: int, seed: int, fmt: str = "JPEG") -> bytes:
    """A noisy colour image, encoded with Pillow."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format=fmt)
    return buffer.getvalue()
