"""Ground truth in telemetry: how a model version's predictions fared against the outcomes
apps posted for them over one window (docs/model-quality.md, "Ground truth and live
accuracy").

An app that learns the true outcome of an earlier prediction posts it to its agent by the
request's id; the agent joins it with the prediction's top-1 class (or value) it kept, and
sums the joined outcomes per true label until the next telemetry window carries them. Sums,
not rates, travel (as :class:`~common.protocol.shadow.ShadowReport`'s): the control plane
adds windows and devices exactly, and never sees a request's inputs.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_GROUPS = 1024
"""Label groups in one window's report (classes with an outcome)."""
REGRESSION_GROUP = -1
"""The one group of a regression's outcomes: they have no class."""


class GroundTruthTask(StrEnum):
    CLASSIFICATION = "classification"
    """Outcomes are class indices, judged against the prediction's arg-max: accuracy."""
    REGRESSION = "regression"
    """Outcomes are numbers, judged against the prediction's value: absolute error."""


class OutcomeGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: int = Field(ge=REGRESSION_GROUP)
    """The true class of these outcomes; ``REGRESSION_GROUP`` for a regression's."""
    outcomes: int = Field(ge=1)
    """Outcomes joined with a kept prediction (one per row)."""
    correct: int = Field(default=0, ge=0)
    """Of those, predictions whose top-1 class was the true one (classification)."""
    abs_error_sum: float = Field(default=0.0, ge=0)
    """Sum of |predicted - actual| (regression)."""
    squared_error_sum: float = Field(default=0.0, ge=0)
    """Sum of (predicted - actual)^2 (regression)."""


class GroundTruthReport(BaseModel):
    """On a version's telemetry entry: the outcomes joined since the last window."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    task: GroundTruthTask
    groups: list[OutcomeGroup] = Field(min_length=1, max_length=MAX_GROUPS)
