"""Predictions kept for ground truth, and outcomes joined with them.

For a model whose config sets ``[ground_truth] task``, every answered request that carries an
id (the client's, or the one the agent assigned and returned) leaves its top-1 class per row
(classification) or its first value per row (regression) here, keyed by that id. An app that
later learns the true outcome posts it (``POST /v2/models/{model}/feedback``); the outcome is
joined with the kept prediction and summed per model version and true label
(:class:`OutcomeSums`), which a sink (the fleet's journal) takes.

Bounded by count and age: past ``max_predictions`` the oldest prediction goes, and one older
than ``prediction_max_age_s`` is expired. Recording costs one dictionary insert and an
arg-max over the request's judged output: nothing waits, nothing is written to disk.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from common.protocol.ground_truth import REGRESSION_GROUP, GroundTruthTask

MAX_CLASS = 2**31
"""Class indices are below this (what the control plane's columns hold)."""
MAX_VALUE = 1e30
"""Regression values and outcomes are smaller than this, so error sums stay finite (JSON has
no infinity: a window carrying one would be refused whole)."""


class GroundTruthSettings(BaseModel):
    """How long the agent keeps predictions for outcomes to join (``[ground_truth]``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_predictions: int = Field(default=100_000, ge=1, le=10_000_000)
    """Requests whose predictions are kept at once; past it the oldest go first."""
    prediction_max_age_s: float = Field(default=86_400.0, gt=0)
    """An outcome posted later than this after its prediction is counted as expired."""
    max_outcomes_per_post: int = Field(default=10_000, ge=1, le=1_000_000)
    """Outcomes in one feedback request; more is a 413 naming ``outcomes``."""


class Prediction(NamedTuple):
    """A tuple: built for every kept request, where a frozen dataclass costs twice as much."""

    model: str
    version: int
    task: GroundTruthTask
    values: tuple[float, ...]
    """Top-1 class (as a float) or value, per row of the request."""
    at: float
    """When it was answered, on the monotonic clock."""


@dataclass
class Sums:
    outcomes: int = 0
    correct: int = 0
    abs_error_sum: float = 0.0
    squared_error_sum: float = 0.0


@dataclass
class OutcomeSums:
    """Joined outcomes of one post, per (model, version, task, true label)."""

    groups: dict[tuple[str, int, GroundTruthTask, int], Sums] = field(default_factory=dict)

    def add(self, p: Prediction, predicted: float, actual: float) -> None:
        label = int(actual) if p.task is GroundTruthTask.CLASSIFICATION else REGRESSION_GROUP
        s = self.groups.setdefault((p.model, p.version, p.task, label), Sums())
        s.outcomes += 1
        if p.task is GroundTruthTask.CLASSIFICATION:
            s.correct += int(predicted == actual)
        else:
            error = abs(predicted - actual)
            s.abs_error_sum += error
            s.squared_error_sum += error * error


@dataclass
class JoinResult:
    joined: int = 0
    unknown: int = 0
    """Ids never seen, or whose prediction was pushed out by newer ones."""
    expired: int = 0
    """Ids whose prediction is older than ``prediction_max_age_s``."""
    mismatched: int = 0
    """Outcomes whose labels do not fit the prediction: another model, another row count,
    a class that is not a whole number."""
    sums: OutcomeSums = field(default_factory=OutcomeSums)


def top_values(task: GroundTruthTask, array: np.ndarray) -> tuple[float, ...]:
    """The judged value of each row: its arg-max class, or its first value."""
    # the array's methods and tolist: numpy's module functions cost several times more here
    rows = array if array.ndim == 2 else array.reshape(array.shape[0] if array.ndim else 1, -1)
    if task is GroundTruthTask.CLASSIFICATION:
        return tuple(map(float, rows.argmax(axis=1).tolist()))
    return tuple(map(float, rows[:, 0].tolist()))


class PredictionStore:
    def __init__(
        self,
        settings: GroundTruthSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._kept: OrderedDict[str, Prediction] = OrderedDict()
        self.sink: Callable[[OutcomeSums], None] | None = None
        """Where joined outcomes go (the fleet's journal); None: counted only."""

    def __len__(self) -> int:
        return len(self._kept)

    def record(
        self,
        request_id: str,
        model: str,
        version: int,
        task: GroundTruthTask,
        array: np.ndarray,
    ) -> None:
        """Keep the prediction of an answered request (an id seen again replaces it)."""
        if array.dtype.kind not in "iuf" or array.size == 0:
            return
        values = top_values(task, array)
        regression = task is GroundTruthTask.REGRESSION
        if regression and not all(abs(v) < MAX_VALUE for v in values):  # NaN and inf too
            return
        kept = self._kept
        kept.pop(request_id, None)
        kept[request_id] = Prediction(model, version, task, values, self.clock())
        while len(kept) > self.settings.max_predictions:
            kept.popitem(last=False)

    def join(self, model: str, outcomes: list[tuple[str, list[float]]]) -> JoinResult:
        """Join ``(request id, labels per row)`` of ``model`` with the kept predictions; each
        joined prediction is forgotten once the sink took the sums (an outcome posted twice
        counts once).

        Raises:
            StorageError: the sink could not store the sums; nothing was joined.
        """
        result = JoinResult()
        now = self.clock()
        joined: set[str] = set()
        for request_id, labels in outcomes:
            if request_id in joined:  # twice in one post: it counts once
                result.unknown += 1
                continue
            p = self._kept.get(request_id)
            if p is None:
                result.unknown += 1
                continue
            if now - p.at > self.settings.prediction_max_age_s:
                del self._kept[request_id]
                result.expired += 1
                continue
            if p.model != model or len(labels) != len(p.values) or not _fits(p.task, labels):
                result.mismatched += 1
                continue
            joined.add(request_id)
            for predicted, actual in zip(p.values, labels, strict=True):
                result.sums.add(p, predicted, actual)
            result.joined += 1
        if result.sums.groups and self.sink is not None:
            self.sink(result.sums)  # a sink that fails leaves the predictions for a retry
        for request_id in joined:
            del self._kept[request_id]
        return result


def _fits(task: GroundTruthTask, labels: list[float]) -> bool:
    if task is GroundTruthTask.CLASSIFICATION:
        return all(0 <= v < MAX_CLASS and float(v).is_integer() for v in labels)
    return all(abs(v) < MAX_VALUE for v in labels)
