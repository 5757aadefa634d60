"""The numeric side of input sketches, shared by the agent (which sketches what it serves) and
the control plane (which sketches a version's reference set the same way to compare the two).

Two things must be identical on both sides, or drift would be measured between two ways of
looking rather than between two data sets:

* which values stand for a feature (:func:`feature_matrix`): the first ``k`` columns of a
  ``[N, F]`` input, the first ``k`` channels of an image-like ``[N, C, H, W]`` or
  ``[N, H, W, C]`` one, the last axis of ``[N, T, F]``; at most ``per_row`` values of each
  feature per row, evenly strided (an image's channel has thousands);
* which bin a value falls in (:func:`bin_keys`): DDSketch's logarithmic bins
  (``ddsketch.LogarithmicMapping``), computed with numpy for a whole array at once. The
  library's own ``key()`` is one Python call per value; a test checks that both agree.
"""

from __future__ import annotations

import math

import numpy as np
from ddsketch import LogarithmicMapping

ALL_VALUES = -1
"""The feature index of the sketch over every (strided) value of an input."""


def mapping(relative_accuracy: float) -> LogarithmicMapping:
    return LogarithmicMapping(relative_accuracy)


def feature_matrix(x: np.ndarray, k: int, per_row: int) -> tuple[np.ndarray, str]:
    """``[m, k']`` float64 values, one column per feature or channel (``k' <= k``), and the
    layout (``features`` or ``channels``). An input that is not numeric gives ``[0, 0]``."""
    if x.dtype.kind not in "biuf" or x.ndim == 0 or x.shape[0] == 0 or k <= 0:
        return np.empty((0, 0)), "features"
    n = x.shape[0]
    if x.ndim == 1:
        return x.reshape(n, 1).astype(np.float64), "features"
    if x.ndim == 2:
        return x[:, :k].astype(np.float64), "features"
    if x.ndim == 4 and x.shape[1] <= x.shape[3]:  # NCHW: channels on axis 1
        c = min(k, x.shape[1])
        per = x[:, :c].reshape(n, c, -1)
        per = per[:, :, :: _stride(per.shape[2], per_row)]
        return per.transpose(0, 2, 1).reshape(-1, c).astype(np.float64), "channels"
    c = min(k, x.shape[-1])  # NHWC, or [N, T, F]: features on the last axis
    per = x[..., :c].reshape(n, -1, c)
    per = per[:, :: _stride(per.shape[1], per_row), :]
    return per.reshape(-1, c).astype(np.float64), "channels" if x.ndim == 4 else "features"


def all_values(x: np.ndarray, per_row: int) -> np.ndarray:
    """At most ``per_row`` evenly strided values of each row, flattened (float64)."""
    if x.dtype.kind not in "biuf" or x.ndim == 0 or x.shape[0] == 0:
        return np.empty(0)
    flat = x.reshape(x.shape[0], -1)
    return flat[:, :: _stride(flat.shape[1], per_row)].astype(np.float64).ravel()


def _multiplier(relative_accuracy: float) -> float:
    # LogarithmicMapping's own: log base gamma through log2
    return math.log(2) / math.log1p(2 * relative_accuracy / (1 - relative_accuracy))


def _stride(length: int, per_row: int) -> int:
    return max(1, math.ceil(length / max(1, per_row)))


Bins = tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""zero count, positive keys, their counts, negative keys (of ``-value``), their counts."""


def bin_keys(values: np.ndarray, relative_accuracy: float) -> Bins:
    """DDSketch's bins of ``values`` (non-finite values left out)."""
    m = mapping(relative_accuracy)
    values = values[np.isfinite(values)]
    tiny = m.min_possible
    zero = int(np.count_nonzero(np.abs(values) < tiny))
    # key = ceil(log2(v) * multiplier) + offset, as LogarithmicMapping.key does per value
    multiplier = _multiplier(relative_accuracy)
    out: list[np.ndarray] = []
    for side in (values[values >= tiny], -values[values <= -tiny]):
        keys = np.ceil(np.log2(side) * multiplier).astype(np.int64)
        uniq, counts = np.unique(keys, return_counts=True)
        out += [uniq, counts]
    return zero, out[0], out[1], out[2], out[3]


def key_values(keys: np.ndarray, relative_accuracy: float) -> np.ndarray:
    """The value each bin stands for (within ``relative_accuracy`` of all it holds)."""
    m = mapping(relative_accuracy)
    multiplier = _multiplier(relative_accuracy)
    return np.power(2.0, keys.astype(np.float64) / multiplier) * (2.0 / (1 + m.gamma))
