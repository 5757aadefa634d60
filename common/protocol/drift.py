"""Input sketches in telemetry: what a model version's inputs looked like over one window.

One :class:`InputSketch` per model input, each with a :class:`FeatureSketch` over every
(strided) value of the input (``feature == -1``) and one per feature or channel, for the
first few (the agent's ``input_sketches.features``). A sketch covers one telemetry window
only: the agent starts afresh after each, and the control plane merges windows as it wants
(docs/model-quality.md, "Drift").

The bins are DDSketch's logarithmic bins (``ddsketch.LogarithmicMapping`` at
``relative_accuracy``), sent sparse: the keys that hold values and their counts, for
positive values, for negative ones (keyed by ``-value``) and a count of zeros. Any quantile
is within ``relative_accuracy`` of the true one, and the control plane bins the reference set
the same way (:mod:`common.sketching`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_BINS = 4096
"""Keys per side of one feature's sketch (a 1 % sketch spans 1e-9..1e9 in about 2,100)."""
MAX_FEATURES = 65
"""Feature sketches per input: the all-values one and up to 64 features."""


class FeatureSketch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    feature: int = Field(ge=-1)
    """Column (``[N, F]`` inputs) or channel (image-like inputs); -1: every value."""
    count: int = Field(ge=0)
    """Values summarised by ``mean`` and ``variance`` (every row of the window)."""
    mean: float | None = None
    variance: float | None = None
    """Population variance."""
    zero_count: int = Field(default=0, ge=0)
    keys: list[int] = Field(default_factory=list, max_length=MAX_BINS)
    counts: list[int] = Field(default_factory=list, max_length=MAX_BINS)
    negative_keys: list[int] = Field(default_factory=list, max_length=MAX_BINS)
    negative_counts: list[int] = Field(default_factory=list, max_length=MAX_BINS)


class InputSketch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    rows: int = Field(ge=0)
    """Rows the input had over the window."""
    sampled_rows: int = Field(ge=0)
    """Rows of those whose values went into the bins (the agent's per-window budget)."""
    layout: Literal["features", "channels"] = "features"
    relative_accuracy: float = Field(gt=0, lt=1)
    features: list[FeatureSketch] = Field(default_factory=list, max_length=MAX_FEATURES)
