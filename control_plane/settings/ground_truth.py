"""Settings of ground truth and concept drift, nested in the control plane's as
``ground_truth`` (``EDGEFLEET_CP_GROUND_TRUTH__*``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GroundTruthSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    concept_drift_threshold: float = Field(default=0.1, gt=0, le=1)
    """A version whose live accuracy over the fleet falls more than this below its reference
    accuracy (0.1: ten points) is logged as a concept drift alert and counted
    (``edgefleet_concept_drift_alerts``)."""
    min_outcomes: int = Field(default=100, ge=1)
    """Outcomes over ``window_s`` before concept drift is judged: a handful proves nothing."""
    window_s: float = Field(default=3600.0, gt=0)
    """The span of outcomes (by when the control plane received them) concept drift and the
    ``edgefleet_live_accuracy`` gauge are computed over."""
    check_interval_s: float = Field(default=30.0, gt=0)
    """How often each version with outcomes in ``window_s`` is judged."""
