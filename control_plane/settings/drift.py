"""Settings of input drift, nested in the control plane's as ``drift``
(``EDGEFLEET_CP_DRIFT__*``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DriftSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    """Compare the input sketches devices send with each version's reference set."""
    psi_threshold: float = Field(default=0.2, gt=0)
    """A device (or the fleet) whose largest PSI of any feature passes this is logged as a
    drift alert and counted (``edgefleet_input_drift_alerts``)."""
    decay: float = Field(default=0.5, ge=0, lt=1)
    """What the earlier windows of a device weigh when a new one comes in: 0.5 makes a shift
    half of what is judged after one window, seven eighths after three; 0 judges each window
    alone."""
    min_rows: float = Field(default=500.0, ge=1)
    """Sampled rows (decayed) a device's windows must hold before drift is judged. Two samples
    of one distribution still differ: their PSI is about ``(bins - 1) * (1/rows +
    1/reference_rows)``, 0.04 for 500 rows against 360 reference rows over 10 bins, the
    largest of several features more."""
    bins: int = Field(default=10, ge=2, le=100)
    """PSI bins, cut at the reference's quantiles."""
    fleet_interval_s: float = Field(default=10.0, ge=0)
    """How often the fleet-wide drift of a version (every device's windows merged) is
    recomputed at most."""
    forget_after_s: float = Field(default=3600.0, gt=0)
    """A device's windows of a version it has not sent sketches of for this long are
    dropped from memory (its stored drift stays)."""
    queue_limit: int = Field(default=10_000, ge=1)
    """Telemetry messages with sketches waiting to be judged; more are dropped (counted)."""
