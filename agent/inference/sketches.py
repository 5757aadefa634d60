"""Streaming sketches of the inputs and outputs each model version serves, sent in telemetry
(input and output drift).

Per (model, version) and input, over one telemetry window, a sample of the requests is kept:
every request until ``sample_rows_per_window`` rows are, then a uniform sample of the
window's requests (reservoir sampling, Algorithm R: a request past the budget costs one
random number unless it replaces a kept one). A kept request costs a strided copy of its
first ``features`` columns or channels and of ``values_per_row`` values of each row (two
small numpy slices). When the window is taken, off the request path, the kept values are
summarised: count, mean, variance, and DDSketch's logarithmic bins (:mod:`common.sketching`),
from which any quantile follows within ``relative_accuracy``.

Outputs are sketched the same way, and of an output shaped ``[N, classes]`` the index of each
row's highest score too (its argmax taken of the kept requests only): the predicted class mix.

:meth:`InputSketchBook.take_all` returns the window's sketches and starts the next one.
Everything runs on the event loop (the service's completion callbacks, the telemetry loop).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import NamedTuple

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
    outputs: bool = True
    """Sketch the outputs too, and of a ``[N, classes]`` output the top-1 class (output
    drift: the predicted class mix)."""


@dataclass
class _InputWindow:
    layout: str = "features"
    rows: int = 0
    requests: int = 0
    kept_rows: int = 0
    kept: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)
    """(rows, feature matrix, all values) of the sampled requests."""

    def add(self, x: np.ndarray, settings: InputSketchSettings, rng: random.Random) -> None:
        slot = self.slot(x, settings, rng)
        if slot is not None:
            self.keep(slot, x, settings)

    def slot(self, x: np.ndarray, settings: InputSketchSettings, rng: random.Random) -> int | None:
        """Count ``x``'s rows; where it goes among the kept requests, None: not kept."""
        n = x.shape[0] if x.ndim else 1
        self.rows += n
        self.requests += 1
        if self.kept_rows < settings.sample_rows_per_window:
            return len(self.kept)
        # reservoir sampling of requests (Algorithm R): each one kept alike
        slot = rng.randrange(self.requests)
        return slot if slot < len(self.kept) else None

    def keep(self, slot: int, x: np.ndarray, settings: InputSketchSettings) -> None:
        n = x.shape[0] if x.ndim else 1
        matrix, self.layout = feature_matrix(x, settings.features, settings.values_per_row)
        self._put(slot, (n, matrix, all_values(x, settings.values_per_row)))  # copies: safe

    def keep_classes(self, slot: int, scores: np.ndarray) -> None:
        """Keep the class each row of ``scores`` (``[N, classes]``) scored highest: one column,
        the same values as the whole (one copy for both)."""
        classes = scores.argmax(axis=1).astype(np.float64)
        self._put(slot, (len(classes), classes.reshape(-1, 1), classes))

    def _put(self, slot: int, sample: tuple[int, np.ndarray, np.ndarray]) -> None:
        n = sample[0]
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


class Sketches(NamedTuple):
    """One version's sketches of a window."""

    inputs: list[InputSketch]
    outputs: list[InputSketch]
    top1: list[InputSketch]
    """Of each ``[N, classes]`` output: the class each row scored highest (the class mix)."""


class _VersionWindows(NamedTuple):
    inputs: dict[str, _InputWindow]
    outputs: dict[str, _InputWindow]
    top1: dict[str, _InputWindow]


class InputSketchBook:
    """The current window's input (and output) sketches of every model version that served
    requests."""

    def __init__(self, settings: InputSketchSettings) -> None:
        self.settings = settings
        self._windows: dict[tuple[str, int], _VersionWindows] = {}
        self._rng = random.Random()

    def observe(
        self,
        model: str,
        version: int,
        inputs: dict[str, np.ndarray],
        outputs: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Count one served request's decoded inputs and its outputs (cheap: see the module's
        docstring)."""
        per = self._windows.get((model, version))
        if per is None:
            per = self._windows[(model, version)] = _VersionWindows({}, {}, {})
        for name, x in inputs.items():
            _window(per.inputs, name).add(x, self.settings, self._rng)
        if outputs is None or not self.settings.outputs:
            return
        for name, y in outputs.items():
            _window(per.outputs, name).add(y, self.settings, self._rng)
            if y.ndim == 2 and y.shape[1] > 1 and y.dtype.kind in "iuf":
                window = _window(per.top1, name)
                slot = window.slot(y, self.settings, self._rng)
                if slot is not None:  # the argmax only of the rows kept
                    window.keep_classes(slot, y)

    def take_all(self) -> dict[tuple[str, int], Sketches]:
        """The window's sketches per (model, version) that served requests; the next window
        starts empty (a version that left service is dropped with it)."""
        windows, self._windows = self._windows, {}
        return {key: Sketches(*(self._sketch(w) for w in per)) for key, per in windows.items()}

    def _sketch(self, windows: dict[str, _InputWindow]) -> list[InputSketch]:
        return [w.sketch(name, self.settings) for name, w in windows.items() if w.kept]


def _window(windows: dict[str, _InputWindow], name: str) -> _InputWindow:
    window = windows.get(name)
    if window is None:
        window = windows[name] = _InputWindow()
    return window
