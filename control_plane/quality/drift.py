"""Drift of live inputs against a version's reference set, one feature at a time.

Both sides are binned alike, with DDSketch's logarithmic bins at the live sketch's relative
accuracy (:mod:`common.sketching`): the reference set's values go through the same
:func:`common.sketching.feature_matrix` and :func:`common.sketching.bin_keys` as the agent's,
so two discrete distributions on one grid of values are compared, and a value never lands in
another bin on one side only because of where the sketch rounded it.

* **PSI** (population stability index) over ``bins`` bins cut at the reference's quantiles:
  ``sum((live - ref) * ln(live / ref))``, each share at least ``PSI_FLOOR`` (an empty bin on
  one side would be infinite). Under 0.1 is commonly read as no change, over 0.2 as a shift.
* **KS**: the largest distance between the two cumulative distributions.
* **Wasserstein** (earth mover's) distance, with scipy, in the feature's units.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import wasserstein_distance

from common.protocol.drift import FeatureSketch
from common.sketching import ALL_VALUES, all_values, bin_keys, feature_matrix, key_values

PSI_FLOOR = 1e-4
REFERENCE_VALUES_PER_ROW = 4096
"""Values of a feature taken from one reference row (an image's channel: strided)."""


@dataclass
class Distribution:
    """Weights on a sorted grid of values: one feature's bins, merged or not."""

    values: np.ndarray
    weights: np.ndarray

    @property
    def total(self) -> float:
        return float(self.weights.sum())


def distribution(bins: dict[float, float]) -> Distribution:
    values = np.fromiter(bins.keys(), dtype=np.float64, count=len(bins))
    weights = np.fromiter(bins.values(), dtype=np.float64, count=len(bins))
    order = np.argsort(values)
    return Distribution(values[order], weights[order])


def sketch_bins(sketch: FeatureSketch, relative_accuracy: float) -> dict[float, float]:
    """A feature sketch's bins as {value the bin stands for: count}."""
    bins: dict[float, float] = {}
    if sketch.zero_count:
        bins[0.0] = float(sketch.zero_count)
    positive = key_values(np.asarray(sketch.keys, dtype=np.int64), relative_accuracy)
    bins.update(zip(positive.tolist(), map(float, sketch.counts), strict=True))
    negative = key_values(np.asarray(sketch.negative_keys, dtype=np.int64), relative_accuracy)
    bins.update(zip((-negative).tolist(), map(float, sketch.negative_counts), strict=True))
    return bins


def values_bins(values: np.ndarray, relative_accuracy: float) -> dict[float, float]:
    """Raw values binned as the agent bins them."""
    zero, keys, counts, nkeys, ncounts = bin_keys(values, relative_accuracy)
    sketch = FeatureSketch(
        feature=0,
        count=len(values),
        zero_count=zero,
        keys=keys.tolist(),
        counts=counts.tolist(),
        negative_keys=nkeys.tolist(),
        negative_counts=ncounts.tolist(),
    )
    return sketch_bins(sketch, relative_accuracy)


def reference_features(x: np.ndarray, features: list[int]) -> dict[int, np.ndarray]:
    """The reference input's values of each feature index asked for (-1: all values)."""
    wanted = [f for f in features if f != ALL_VALUES]
    matrix, _ = feature_matrix(x, max(wanted, default=-1) + 1, REFERENCE_VALUES_PER_ROW)
    out = {f: matrix[:, f] for f in wanted if f < matrix.shape[1]}
    if ALL_VALUES in features:
        out[ALL_VALUES] = all_values(x, REFERENCE_VALUES_PER_ROW)
    return {f: v[np.isfinite(v)] for f, v in out.items()}


def psi(live: Distribution, ref: Distribution, bins: int = 10) -> float:
    """Population stability index, bins cut at the reference's weighted quantiles."""
    cdf = np.cumsum(ref.weights) / ref.total
    cuts = np.unique(ref.values[np.searchsorted(cdf, np.arange(1, bins) / bins)])
    # bin i holds (cuts[i-1], cuts[i]]: grid values on an edge fall alike on both sides
    shares = []
    for d in (live, ref):
        where = np.searchsorted(cuts, d.values, side="left")
        counts = np.bincount(where, weights=d.weights, minlength=len(cuts) + 1)
        shares.append(np.maximum(counts / d.total, PSI_FLOOR))
    a, e = shares
    return float(np.sum((a - e) * np.log(a / e)))


def ks(live: Distribution, ref: Distribution) -> float:
    """Two-sample Kolmogorov-Smirnov statistic of two weighted distributions."""
    grid = np.union1d(live.values, ref.values)
    cdfs = []
    for d in (live, ref):
        cum = np.concatenate(([0.0], np.cumsum(d.weights) / d.total))
        cdfs.append(cum[np.searchsorted(d.values, grid, side="right")])
    return float(np.max(np.abs(cdfs[0] - cdfs[1])))


def wasserstein(live: Distribution, ref: Distribution) -> float:
    return float(wasserstein_distance(live.values, ref.values, live.weights, ref.weights))


@dataclass(frozen=True)
class FeatureDrift:
    input: str
    feature: int
    psi: float
    ks: float
    wasserstein: float
    live_mean: float | None
    reference_mean: float

    @property
    def label(self) -> str:
        return f"{self.input}[{'*' if self.feature == ALL_VALUES else self.feature}]"

    def to_dict(self) -> dict[str, object]:
        return {
            "input": self.input,
            "feature": self.feature,
            "psi": round(self.psi, 6),
            "ks": round(self.ks, 6),
            "wasserstein": round(self.wasserstein, 6),
            "live_mean": self.live_mean,
            "reference_mean": self.reference_mean,
        }


def feature_drift(
    name: str,
    feature: int,
    live: Distribution,
    ref: Distribution,
    live_mean: float | None,
    reference_mean: float,
    bins: int,
) -> FeatureDrift:
    return FeatureDrift(
        name,
        feature,
        psi(live, ref, bins),
        ks(live, ref),
        wasserstein(live, ref),
        live_mean,
        reference_mean,
    )
