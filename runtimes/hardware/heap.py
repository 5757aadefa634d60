"""Giving the C heap's free memory back to the system after a model loads.

Loading a model, its warm-up and the batch-size measurement (:mod:`agent.inference.tuning`,
up to 32 rows of a 600 KB image side by side on every instance) allocate far more than serving
holds afterwards. ONNX Runtime's sessions run without their memory arena (which would keep its
largest size for good; :mod:`runtimes.backends.onnxruntime_backend`), so that memory goes back
to glibc's heap, and glibc keeps a heap's free pages until asked: ``malloc_trim`` asks. With
``mlp`` and ``cnn`` on two instances each, after runs of up to 32 rows, the process held 293 MB
without the arena and 99 MB once trimmed (811 MB with the arena; benchmarks/findings.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None (musl, macOS: nothing to call)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def trim_heap() -> bool:
    """Return the C heap's free memory to the system, where the C library can (glibc);
    whether it could. Takes a few milliseconds: for after a load, not per request."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
