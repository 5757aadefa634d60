"""Streaming sketches of the inputs each model version serves, sent in telemetry (drift).

Per (model, version) and input, over one telemetry window, a sample of the requests is kept:
every request until ``sample_rows_per_window`` rows are, then a uniform sample of the
window's requests (reservoir sampling, Algorithm R: a request past the budget costs one
random number unless it replaces a kept one). A kept request costs a strided copy of its
first ``features`` columns or channels and of ``values_per_row`` values of each row (two
small numpy slices). When the window is taken, off the request path, the kept values are
summarised: count, mean, variance, and DDSketch's logarithmic bins (:mod:`common.sketching`),
from which any quantile follows within ``relative_accuracy``.

:meth:`InputSketchBook.take_all` returns the window's sketches and starts the next one.
Everything runs on the event loop (the service's completion callbacks, the telemetry loop).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from common.protocol.drift import FeatureSketch, InputSketch
from common.sketching import ALL_VALUES, all_values, bin_keys, feature_matrix


class InputSketchSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    """Sketch served inputs and send them in telemetry (the control plane's drift)."""
    features: int = Field(default=8, ge=1, le=64)
    """Features (columns) or channels sketched one by one, the first ones of each input."""
    values_per_row: int = Field(default=64, ge=1, le=4096)
    """Values of a feature (and of the whole input) taken from one row, evenly strided: an
    image's channel holds thousands."""
    sample_rows_per_window: int = Field(default=512, ge=1, le=100_000)
    """Rows per window and input whose values are binned; every row counts to mean and
    variance."""
    relative_accuracy: float = Field(default=0.02, gt=0, lt=0.5)
    """DDSketch's relative accuracy: bins are this narrow relative to their values."""


@dataclass
class _InputWindow:
    layout: str = "features"
    rows: int = 0
    requests: int = 0
    kept_rows: int = 0
    kept: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)
    """(rows, feature matrix, all values) of the sampled requests."""

    def add(self, x: np.ndarray, settings: InputSketchSettings, rng: random.Random) -> None:
        n = x.shape[0] if x.ndim else 1
        self.rows += n
        self.requests += 1
        if self.kept_rows < settings.sample_rows_per_window:
            slot = len(self.kept)
        else:  # reservoir sampling of requests (Algorithm R): each one kept alike
            slot = rng.randrange(self.requests)
            if slot >= len(self.kept):
                return
        matrix, self.layout = feature_matrix(x, settings.features, settings.values_per_row)
        sample = (n, matrix, all_values(x, settings.values_per_row))  # copies: safe to keep
        if slot == len(self.kept):
            self.kept.append(sample)
        else:
            self.kept_rows -= self.kept[slot][0]
            self.kept[slot] = sample
        self.kept_rows += n

    def sketch(self, name: str, settings: InputSketchSettings) -> InputSketch:
        accuracy = settings.relative_accuracy
        columns = max((m.shape[1] for _, m, _ in self.kept), default=0)
        features = []
        for i in range(-1, columns):
            if i == ALL_VALUES:
                kept = [v for _, _, v in self.kept]
            else:
                kept = [m[:, i] for _, m, _ in self.kept if m.shape[1] == columns]
            values = np.concatenate(kept) if kept else np.empty(0)
            values = values[np.isfinite(values)]
            zero, keys, counts, nkeys, ncounts = bin_keys(values, accuracy)
            features.append(
                FeatureSketch(
                    feature=i,
                    count=len(values),
                    mean=float(values.mean()) if len(values) else None,
                    variance=float(values.var()) if len(values) else None,
                    zero_count=zero,
                    keys=keys.tolist(),
                    counts=counts.tolist(),
                    negative_keys=nkeys.tolist(),
                    negative_counts=ncounts.tolist(),
                )
            )
        return InputSketch(
            name=name,
            rows=self.rows,
            sampled_rows=self.kept_rows,
            layout="channels" if self.layout == "channels" else "features",
            relative_accuracy=accuracy,
            features=features,
        )


class InputSketchBook:
    """The current window's input sketches of every model version that served requests."""

    def __init__(self, settings: InputSketchSettings) -> None:
        self.settings = settings
        self._windows: dict[tuple[str, int], dict[str, _InputWindow]] = {}
        self._rng = random.Random()

    def observe(self, model: str, version: int, inputs: dict[str, np.ndarray]) -> None:
        """Count one served request's decoded inputs (cheap: see the module's docstring)."""
        per_input = self._windows.setdefault((model, version), {})
        for name, x in inputs.items():
            window = per_input.get(name)
            if window is None:
                window = per_input[name] = _InputWindow()
            window.add(x, self.settings, self._rng)

    def take_all(self) -> dict[tuple[str, int], list[InputSketch]]:
        """The window's sketches per (model, version) that served requests; the next window
        starts empty (a version that left service is dropped with it)."""
        windows, self._windows = self._windows, {}
        return {
            key: [w.sketch(name, self.settings) for name, w in per.items() if w.kept]
            for key, per in windows.items()
        }
