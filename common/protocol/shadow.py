"""What a device measures of the versions it holds, and the shadow stage that asks for it.

A rollout with a shadow phase sends each device of a wave the candidate's manifest marked
:class:`ShadowStage` (signed like any other): the device verifies, loads and warms it next to
the serving version without switching, copies a sampled share of the live requests to it and
compares the answers. Each telemetry window then carries a :class:`ShadowReport` on the serving
version's entry; the control plane sums them over the wave's devices and its ``min_agreement``
gate decides whether the wave switches. Sums, not rates, travel: the control plane adds up
windows and devices exactly.

:class:`VariantSpeed` is what the agent's batch tuning (``[batching] tune``) measured for the
variant it serves, sent once per loaded version.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ShadowStage(BaseModel):
    """On a manifest: stage this version as a shadow of what serves; do not switch to it.

    An agent that predates the field ignores it (manifests ignore unknown fields) and installs
    the version as a plain update: roll shadows out only to agents that report shadow windows."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sample_share: float = Field(gt=0, le=1)
    """Share of the serving version's successful requests copied to the candidate."""


class ShadowReport(BaseModel):
    """One telemetry window of a staged candidate, compared with the serving version on the
    requests copied to it. Answers are discarded after comparison."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1)
    """The candidate's version."""
    sequence: int | None = Field(default=None, ge=1)
    """The manifest sequence of the shadow stage."""
    requests: int = Field(default=0, ge=0)
    """Requests the candidate answered in the window (compared)."""
    rows: int = Field(default=0, ge=0)
    """Rows compared (arg-max of the first output, per row)."""
    matched: int = Field(default=0, ge=0)
    """Rows whose top-1 class the candidate and the serving version agree on."""
    dropped: int = Field(default=0, ge=0)
    """Sampled requests dropped because the shadow queue was full (never waited for)."""
    errors: int = Field(default=0, ge=0)
    """Copied requests the candidate failed on."""
    max_abs_diff: float | None = None
    """Largest absolute difference between the two versions' outputs in the window."""
    rel_error_sum: float = Field(default=0.0, ge=0)
    """Sum over the compared requests of max|candidate - serving| / max|serving|."""
    candidate_ms_sum: float = Field(default=0.0, ge=0)
    """Sum of the candidate's compute milliseconds over the compared requests."""
    serving_ms_sum: float = Field(default=0.0, ge=0)
    """Sum of the serving version's compute milliseconds over the same requests."""


class VariantSpeed(BaseModel):
    """The rows per second the agent's batch tuning measured for the version it serves."""

    model_config = ConfigDict(extra="forbid")

    rows_per_s: float = Field(ge=0)
    """Best rate measured at the batch size kept, all instances side by side."""
    batch_size: int = Field(ge=1)
    """The batch size the tuning kept (1: no batching)."""
    format: str = Field(max_length=32)
    """The served file's format: ``onnx``, ``openvino_ir``, ``tflite``."""
    profile: str = Field(max_length=128)
    """The device's hardware profile (which variant a profile gets is the manifest's rule)."""
    placement: str = Field(default="", max_length=128)
    """Where it runs, e.g. ``onnxruntime:CPU``."""
