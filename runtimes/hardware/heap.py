"""Giving the C heap's free memory back to the system after a model loads.

Loading a model, its warm-up and the batch-size measurement (:mod:`agent.inference.tuning`,
up to 32 rows of a 600 KB image side by side on every instance) allocate far more than serving
holds afterwards. ONNX Runtime's sessions run without their memory arena (which would keep its
largest size for good; :mod:`runtimes.backends.onnxruntime_backend`), so that memory goes back
to glibc's heap, and glibc keeps a heap's free pages until asked: ``malloc_trim`` asks. With
``mlp`` and ``cnn`` on two instances each, after runs of up to 32 rows, the process held 293 MB
without the arena and 99 MB once trimmed (811 MB with the arena; benchmarks/findings.md).

glibc gives each thread that allocates its own heap (up to eight per core), and a trim gives
back little of those: ``cnn``'s two instances after the batch-size measurement, in its threads,
kept 135 MB trimmed against 115 without the measurement, and 116 with one heap for every thread
(:func:`limit_heaps`). The threads that allocate much (the instances', the loads') allocate a
few large blocks per inference, so sharing one heap's lock costs them nothing measurable; most
of Python's small objects never reach ``malloc``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter for the most heaps (arenas) its threads may use."""


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None (musl, macOS: nothing to call)."""
    libc = _libc()
    trim: Callable[[int], int] | None = getattr(libc, "malloc_trim", None)
    return trim


def limit_heaps() -> bool:
    """Have every thread that has not allocated yet share the main heap (glibc), so that
    :func:`trim_heap` reaches what they free; whether it could. For the start of a process,
    before the threads that load and run models exist."""
    mallopt: Callable[[int, int], int] | None = getattr(_libc(), "mallopt", None)
    return mallopt is not None and mallopt(M_ARENA_MAX, 1) == 1


def trim_heap() -> bool:
    """Return the C heap's free memory to the system, where the C library can (glibc);
    whether it could. Takes a few milliseconds: for after a load, not per request."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
