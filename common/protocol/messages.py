"""Versioned messages. Each carries ``schema_version``; a receiver refuses other versions.

Manifests travel signed (see :mod:`common.protocol.signing`); status, telemetry and events are
published by the device under its own topics, which the broker's ACL protects.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from common.protocol.diagnostics import MAX_DIAGNOSTIC_BYTES, LogLevel
from common.protocol.drift import InputSketch
from common.protocol.ground_truth import GroundTruthReport
from common.protocol.shadow import ShadowReport, ShadowStage, VariantSpeed
from common.protocol.twin import TwinReport

Sha256 = str


def _require_zones(*stamps: datetime) -> None:
    # A device compares them with its UTC clock: a naive one would raise TypeError there (and
    # in the comparison of the two), which is no validation error, instead of a refusal.
    if any(stamp.utcoffset() is None for stamp in stamps):
        raise ValueError("issued_at and expires_at need a time zone")


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1


# -- manifests -------------------------------------------------------------------------------


class FileRef(BaseModel):
    """One file, fetched by digest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    """File name inside the version directory (model.onnx, model.xml, model.bin, golden.npz)."""
    url: str
    sha256: Sha256 = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class ArtifactVariant(BaseModel):
    """The model files for some hardware profiles (or for any device that can run the format)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["onnx", "openvino_ir", "tflite", "genai"]
    """``genai``: a generative model's whole folder (``genai_config.json``, decoder, tokenizer)."""
    profiles: list[str] = Field(default_factory=list)
    """Hardware profiles this variant is for; empty means any device that can run the format."""
    files: list[FileRef] = Field(min_length=1)


class HealthCriteria(BaseModel):
    """What the new version must show during its health window before it is committed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    window_s: float = Field(default=30.0, ge=0)
    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    max_p99_ratio: float = Field(default=1.5, gt=0)
    """p99 latency of the new version over the previous one's (before the switch)."""
    min_requests: int = Field(default=20, ge=0)
    """Below this many requests in the window, error rate and latency are not judged."""
    self_test: bool = True
    """Run the golden sample again at the end of the window."""


class TargetSelector(BaseModel):
    """Which devices a manifest is for. Every field given must match."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device_ids: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    profiles: list[str] = Field(default_factory=list)

    def matches(self, device_id: str, labels: dict[str, str], profile: str) -> str | None:
        """None if the device is targeted, else why not."""
        if self.device_ids and device_id not in self.device_ids:
            return f"device {device_id} is not among the {len(self.device_ids)} target devices"
        for key, value in self.labels.items():
            if labels.get(key) != value:
                return f"label {key}={value} does not match this device ({key}={labels.get(key)!r})"
        if self.profiles and profile not in self.profiles:
            return f"profile {profile} is not among {self.profiles}"
        return None


class ModelManifest(BaseModel):
    """What the fleet wants a device to serve for one model. Signed; see docs/protocol.md."""

    model_config = ConfigDict(extra="ignore")  # signed bytes, not this model, are what is verified

    schema_version: Literal[1] = 1
    model: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    version: int = Field(ge=1)
    sequence: int = Field(ge=1)
    """Monotonically increasing per model across the fleet; a device refuses anything not newer
    than what it last applied (anti-rollback, kept across restarts)."""
    artifacts: list[ArtifactVariant] = Field(min_length=1)
    golden: FileRef | None = None
    """Golden input and expected output (golden.npz) for the self-test."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Serving configuration (the keys of the model's config.toml: batching, instances, ...)."""
    health: HealthCriteria = Field(default_factory=HealthCriteria)
    target: TargetSelector = Field(default_factory=TargetSelector)
    rollout_id: str | None = None
    issued_at: datetime
    expires_at: datetime
    activate_after: datetime | None = None
    """A maintenance window: download and verify now, switch to it no earlier than this (the
    device's clock). Agents before this field switch at once."""
    shadow: ShadowStage | None = None
    """Stage this version next to the serving one and copy it a share of the live requests,
    without switching (a rollout's shadow phase, :mod:`common.protocol.shadow`)."""

    @model_validator(mode="after")
    def _expiry_after_issue(self) -> ModelManifest:
        _require_zones(self.issued_at, self.expires_at)
        if self.activate_after is not None and self.activate_after.utcoffset() is None:
            raise ValueError("activate_after needs a time zone")
        if self.expires_at <= self.issued_at:
            raise ValueError("expires_at must be after issued_at")
        return self

    def variant_for(self, profile: str, can_run: set[str]) -> ArtifactVariant | None:
        """The variant built for ``profile``, else the first generic one in a runnable format."""
        for variant in self.artifacts:
            if profile in variant.profiles:
                return variant
        for variant in self.artifacts:
            if not variant.profiles and variant.format in can_run:
                return variant
        return None


class DesiredState(_Message):
    """Retained on a device's desired topic: the signed manifests it should converge to."""

    device_id: str
    issued_at: datetime
    manifests: list[dict[str, Any]] = Field(default_factory=list)
    """Signed envelopes of :class:`ModelManifest`, verified one by one by the device."""


class CommandType(StrEnum):
    ROLLBACK = "rollback"
    LOGS = "logs"
    """Upload the device's recent log lines (docs/operations.md, "Seeing a device's logs")."""
    SUPPORT_BUNDLE = "support-bundle"
    """Upload a support bundle: redacted config, versions, events, metrics, outbox state."""


class Command(BaseModel):
    """Signed like a manifest, sent on a device's commands topic."""

    model_config = ConfigDict(extra="ignore")

    schema_version: Literal[1] = 1
    command_id: str = Field(min_length=1, max_length=128)
    device_id: str
    type: CommandType
    model: str = ""
    """The model a rollback acts on (empty for logs and support bundles)."""
    from_version: int | None = None
    """Roll back only if the device runs this version (a device that already rolled back
    locally, or never got there, stays where it is)."""
    reason: str = ""
    issued_at: datetime
    expires_at: datetime
    since: datetime | None = None
    """Logs: the oldest line's time (None: as far back as the device keeps)."""
    until: datetime | None = None
    """Logs: the newest line's time (None: up to now)."""
    min_level: LogLevel | None = None
    """Logs: the least severe level sent (None: all that were written)."""
    max_bytes: int | None = Field(default=None, ge=1, le=MAX_DIAGNOSTIC_BYTES)
    """Logs and bundles: the answer's size cap (the newest log lines that fit)."""

    @model_validator(mode="after")
    def _zoned(self) -> Command:
        _require_zones(self.issued_at, self.expires_at)
        if any(t is not None and t.utcoffset() is None for t in (self.since, self.until)):
            raise ValueError("since and until need a time zone")
        return self


# -- device to fleet --------------------------------------------------------------------------


class CaptureStatus(BaseModel):
    """A model's data capture on the device: its policy (``[capture]`` of its config) and
    what it captured since the agent started (docs/model-quality.md, "Data capture")."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool
    sample_rate: float
    low_confidence_below: float | None = None
    shadow_disagreement: bool = False
    max_sample_bytes: int
    max_samples_per_minute: int
    max_disk_bytes: int
    retention_days: float
    captured: dict[str, int] = Field(default_factory=dict)
    """Samples stored in the spool, by trigger."""
    uploaded: int = 0
    """Samples the control plane acknowledged."""
    dropped: dict[str, int] = Field(default_factory=dict)
    """Samples chosen and not kept, by reason (queue_full, rate_limited, too_large, evicted,
    expired, unstorable)."""
    spooled: int = 0
    """Samples on the device's disk now, waiting for upload."""
    spooled_bytes: int = 0


class ServedModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    version: int
    sequence: int | None = None
    """The manifest sequence this version came from, if the fleet sent it."""
    capture: CaptureStatus | None = None
    """Its data capture, where its config has a ``[capture]`` policy or it captured."""


class AgentPhase(StrEnum):
    """The agent as its launcher sees it (agent/launcher)."""

    RUNNING = "running"
    DEGRADED = "degraded"
    """The agent exited (or failed a trial) and was restarted: it runs again, but the crash
    loop is not over (it has not yet stayed up the launcher's ``stable_after_s``)."""


class AgentReleaseOutcome(StrEnum):
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"


class AgentUpdate(BaseModel):
    """How the last agent release put on trial on this device ended."""

    model_config = ConfigDict(extra="forbid")

    version: str = Field(max_length=64)
    outcome: AgentReleaseOutcome
    reason: str | None = Field(default=None, max_length=500)
    """Why it went back (``crashed before ready (exit 1): ...``, ``not ready within 30 s``)."""
    at: datetime


class LauncherReport(BaseModel):
    """What the launcher under the agent says, in the agent's birth message."""

    model_config = ConfigDict(extra="forbid")

    release: str = Field(max_length=64)
    """The release running (``base``: the agent installed with the launcher)."""
    phase: AgentPhase
    last_error: str | None = Field(default=None, max_length=500)
    """Why the agent last exited, while ``degraded``."""
    exits_in_a_row: int = Field(default=0, ge=0)
    last_update: AgentUpdate | None = None


class DeviceStatus(_Message):
    """Retained on the status topic: the birth message when online, the last will when not."""

    device_id: str
    online: bool
    agent_version: str | None = None
    hardware_profile: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    models: list[ServedModel] = Field(default_factory=list)
    sent_at: datetime | None = None
    telemetry_interval_s: float | None = Field(default=None, gt=0)
    """How often the device publishes telemetry: the control plane shows an online device it has
    not heard from for several of these as silent (its will may never have been published)."""
    trust_root_version: int | None = Field(default=None, ge=1)
    """The version of the trust root the device holds (it verifies manifests and commands with
    it): the operator sees which devices have a new root before revoking an old key."""
    launcher: LauncherReport | None = None
    """Present when the agent runs under the launcher (``edgefleet launcher run``)."""
    twin: TwinReport | None = None
    """The config twin the device applied (:mod:`common.protocol.twin`); none: none yet."""


class UpdateState(StrEnum):
    RECEIVED = "received"
    REJECTED = "rejected"
    DOWNLOADING = "downloading"
    VERIFIED = "verified"
    STAGED = "staged"
    ACTIVE = "active"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"


class UpdateEvent(_Message):
    device_id: str
    event_id: str
    time: datetime
    model: str
    version: int | None = None
    sequence: int | None = None
    rollout_id: str | None = None
    state: UpdateState
    code: str | None = None
    """Rejection or rollback reason code (see :class:`common.protocol.errors.Rejection`)."""
    reason: str | None = None
    progress: float | None = Field(default=None, ge=0, le=1)
    bytes_done: int | None = Field(default=None, ge=0)
    """Downloading: bytes of the version's files fetched so far."""
    bytes_total: int | None = Field(default=None, ge=0)
    """Downloading: bytes of the version's files in all."""
    window_s: float | None = Field(default=None, ge=0)
    """Active: the length of the health window that began with this event (the version is
    committed or rolled back when it ends, or sooner on failures)."""


class GenerativeTelemetry(BaseModel):
    """A generative version's window: tokens in and out, and the token latencies its users
    feel (p99 over the sequences and gaps of the window). Its sequences are the window's
    ``requests``; those a model step failed are its ``errors``."""

    model_config = ConfigDict(extra="forbid")

    prompt_tokens: int = Field(default=0, ge=0)
    generated_tokens: int = Field(default=0, ge=0)
    ttft_p99_ms: float | None = None
    """Time to first token, p99 over the first tokens of the window."""
    inter_token_p99_ms: float | None = None
    """Between consecutive tokens of a sequence, p99 over the gaps of the window."""
    cost_per_1k_tokens: float | None = Field(default=None, ge=0)
    """The device's cost over the window (its ``device_hourly_cost``) per thousand tokens this
    version generated in it, as ``edgefleet_cost_per_1k_predictions`` charges the whole device;
    None without a cost set or tokens generated."""


class ModelTelemetry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    version: int
    requests: int
    errors: int
    rows: int
    batches: int
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    mean_batch_size: float | None = None
    queue_depth: int = 0
    busy_s: float = Field(default=0.0, ge=0)
    """The device time this version's batches took in the window: their run time (stacking,
    backend, splitting) over its instance count, each instance holding that share of the
    device. With the device's hourly cost rate, the control plane's cost per prediction."""
    shadow: ShadowReport | None = None
    """The window of a candidate staged as this version's shadow, if one is."""
    speed: VariantSpeed | None = None
    """What batch tuning measured for this version, in the first window after its load."""
    inputs: list[InputSketch] = Field(default_factory=list)
    """Sketches of what this version's inputs looked like over the window (drift)."""
    outputs: list[InputSketch] = Field(default_factory=list)
    """Sketches of its outputs over the window (output drift), by output name."""
    top1: list[InputSketch] = Field(default_factory=list)
    """Of each ``[N, classes]`` output, by its name: the sketch of the class each row scored
    highest (the predicted class mix)."""
    generative: GenerativeTelemetry | None = None
    """Set for a generative model's version: its tokens and token latencies."""
    ground_truth: GroundTruthReport | None = None
    """The outcomes apps posted for this version's predictions since the last window."""


class DeviceTelemetry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cpu_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_c: float | None = None
    accelerators: dict[str, float] = Field(default_factory=dict)


class Telemetry(_Message):
    device_id: str
    seq: int = Field(ge=1)
    """Per-device counter that survives restarts: gaps show loss, repeats show redelivery."""
    time: datetime
    window_s: float
    models: list[ModelTelemetry] = Field(default_factory=list)
    device: DeviceTelemetry = Field(default_factory=DeviceTelemetry)
    dropped: int = 0
    """Telemetry messages dropped from the offline buffer (bounds reached) since start."""


MAX_ACK_RANGES = 1024
"""Ranges in one acknowledgement; more go in the next message."""


class TelemetryAck(_Message):
    """Fleet to device, on the device's acks topic (QoS 1): the telemetry sequence numbers the
    control plane has stored. The device's outbox keeps each telemetry message until one of
    these covers it, and sends it again otherwise (docs/protocol.md, "Telemetry delivery")."""

    device_id: str
    seqs: list[tuple[int, int]] = Field(min_length=1, max_length=MAX_ACK_RANGES)
    """Inclusive ranges ``[first, last]`` of ``Telemetry.seq``."""

    @model_validator(mode="after")
    def _ranges(self) -> TelemetryAck:
        for first, last in self.seqs:
            if not 1 <= first <= last:
                raise ValueError(f"seqs: [{first}, {last}] is not a range of sequence numbers")
        return self


def seq_ranges(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, merged inclusive ranges of ``seqs``: ``[1, 2, 3, 7]`` -> ``[(1, 3), (7, 7)]``."""
    ranges: list[tuple[int, int]] = []
    for seq in sorted(set(seqs)):
        if ranges and ranges[-1][1] == seq - 1:
            ranges[-1] = (ranges[-1][0], seq)
        else:
            ranges.append((seq, seq))
    return ranges


MESSAGE_TYPES: dict[str, type[BaseModel]] = {
    "model-manifest": ModelManifest,
    "desired-state": DesiredState,
    "command": Command,
    "device-status": DeviceStatus,
    "update-event": UpdateEvent,
    "telemetry": Telemetry,
    "telemetry-ack": TelemetryAck,
}
