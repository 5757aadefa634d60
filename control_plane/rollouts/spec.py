"""What an operator asks of a rollout: its targets, waves, timers and health gates, checked
before anything is stored (a value out of range is a 400 naming the field)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from common.protocol.agent_release import AGENT_VERSION_PATTERN

MAX_DURATION_S = 366 * 86400.0
"""Longest bake time or device timeout a rollout takes (a year): past it a date overflows."""


class Gates(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    max_p99_ratio: float = Field(default=2.0, gt=0, le=1e6)
    min_requests: int = Field(default=20, ge=0)
    """Below this many requests over a bake window, error rate and latency are not judged."""
    self_test: bool = True
    """Fail when any device's self-test fails."""
    max_rejections: int = Field(default=0, ge=0)
    """Devices that refused or rolled back the update locally before the rollout fails."""
    allow_unjudged: bool = False
    """Pass a wave whose error-rate and latency gates could not judge (fewer than
    ``min_requests`` requests) at the end of its bake. Off, such a wave waits for traffic, and
    its status says so: a rollout with no traffic proves nothing about the version."""
    max_ttft_p99_ms: float | None = Field(default=None, gt=0, le=1e9)
    """A generative version's p99 time to first token on the wave's devices (their windows'
    p99s weighted by sequences), in ms; over it the rollout rolls back. None: not judged."""
    max_inter_token_p99_ms: float | None = Field(default=None, gt=0, le=1e9)
    """A generative version's p99 time between tokens (windows weighted by tokens generated),
    in ms; over it the rollout rolls back. None: not judged."""
    max_drift: float | None = Field(default=None, gt=0, le=1e6)
    """Largest PSI of any input feature, on the wave's devices, against the version's
    reference set (docs/model-quality.md, "Drift"). Over it the rollout is paused, not rolled
    back: drift is about the data, not the version. None: not judged."""
    max_accuracy_drop: float | None = Field(default=None, gt=0, le=1)
    """How far the new version's live accuracy (from the outcomes apps post, on the wave's
    devices since the rollout began) may fall below the version it replaces (its outcomes from
    an hour before the rollout on), as a share: 0.05 is five points; for a regression, how far
    its mean absolute error may rise over the baseline's, relative (docs/model-quality.md,
    "Ground truth and live accuracy"). Over it the rollout is paused, not rolled back: the
    outcomes may have moved for both versions. None: not judged."""
    min_outcomes: int = Field(default=100, ge=1, le=2**31 - 1)
    """Outcomes the new version and the baseline each need before ``max_accuracy_drop``
    judges; until then the wave waits past its bake (unless ``allow_unjudged``)."""


AGENT_REFUSED_GATES = (
    "max_drift",
    "max_accuracy_drop",
    "max_ttft_p99_ms",
    "max_inter_token_p99_ms",
)
"""Gates an agent release's rollout refuses: they judge a model's inputs, answers or tokens.
Its error-rate and latency gates are not judged either (its gate report says so): a release
passes a device when the launcher committed it there."""


class ShadowSpec(BaseModel):
    """A shadow phase before each wave switches: the wave's devices stage the candidate next
    to the serving version and answer copies of a share of live requests with it; the wave
    switches once the two agree often enough (:mod:`control_plane.rollouts.shadow`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    sample_share: float = Field(default=0.1, gt=0, le=1)
    """Share of each device's live requests copied to the candidate."""
    min_agreement: float = Field(default=0.99, ge=0, le=1)
    """Top-1 match rate over the wave's shadowed rows the wave needs to switch."""
    min_requests: int = Field(default=100, ge=1, le=2**31 - 1)
    """Shadowed requests, over the wave's devices, before the agreement is judged."""
    timeout_s: float = Field(default=3600.0, gt=0, le=MAX_DURATION_S)
    """Without ``min_requests`` shadowed requests by then, the rollout fails unswitched."""


class RolloutSpec(BaseModel):
    """A model version's rollout (``model`` and ``version``) or an agent release's
    (``agent_version``), never both."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str | None = None
    version: int | None = Field(default=None, ge=1, le=2**31 - 1)
    agent_version: str | None = Field(default=None, pattern=AGENT_VERSION_PATTERN)
    """An agent release of the registry (``edgefleet agents push``): the devices' launchers put
    it on trial; a wave passes when its devices committed it."""
    selector: dict[str, str] = Field(default_factory=dict)
    """Label selector: every label given must match (operator labels win over reported)."""
    profiles: list[str] = Field(default_factory=list)
    waves: list[str] = Field(default_factory=lambda: ["1", "10%", "50%", "100%"])
    bake_time_s: float = Field(default=60.0, ge=0, le=MAX_DURATION_S)
    device_timeout_s: float = Field(default=600.0, gt=0, le=MAX_DURATION_S)
    gates: Gates = Field(default_factory=Gates)
    shadow: ShadowSpec | None = None
    """A shadow phase before each wave switches; none by default."""

    @model_validator(mode="after")
    def _one_subject(self) -> RolloutSpec:
        if self.agent_version is not None:
            if self.model is not None or self.version is not None:
                raise ValueError("give agent_version, or model and version, not both")
            for gate in AGENT_REFUSED_GATES:
                if getattr(self.gates, gate) is not None:
                    raise ValueError(
                        f"gates.{gate} judges a model; an agent release is judged by its "
                        "launcher's trial on each device"
                    )
            if self.shadow is not None:
                raise ValueError("shadow: an agent release cannot be shadowed")
        elif self.model is None or self.version is None:
            raise ValueError("give model and version (or agent_version)")
        return self

    def subject(self) -> tuple[str, int]:
        """The model and version of a model's rollout (checked present when validated)."""
        assert self.model is not None and self.version is not None
        return self.model, self.version

    @field_validator("waves", mode="before")
    @classmethod
    def _as_strings(cls, value: Any) -> Any:
        return [str(v) for v in value] if isinstance(value, list) else value

    @field_validator("waves")
    @classmethod
    def _wave_sizes(cls, waves: list[str]) -> list[str]:
        if not waves:
            raise ValueError("at least one wave")
        for w in waves:
            number = w[:-1] if w.endswith("%") else w
            try:
                value = float(number)
            except ValueError:
                raise ValueError(f"wave {w!r} is not a device count or a percentage") from None
            if not math.isfinite(value) or value <= 0 or (w.endswith("%") and value > 100):
                raise ValueError(f"wave {w!r} is out of range")
            if not w.endswith("%") and not value.is_integer():
                raise ValueError(f"wave {w!r} is not a whole number of devices")
        return waves


def wave_bounds(waves: Sequence[str], total: int) -> list[int]:
    """Cumulative device counts per wave, never decreasing, the last covering its share."""
    bounds, prev = [], 0
    for w in waves:
        n = math.ceil(total * float(w[:-1]) / 100) if w.endswith("%") else int(float(w))
        n = max(prev, min(total, n))
        bounds.append(n)
        prev = n
    return bounds
