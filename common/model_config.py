"""Per-model configuration: ``DIR/<model>/config.toml`` in a model repository.

Every field has a default, so a model directory without a config file serves with sensible
batching. Names carry their units, as Triton's and pytriton's do::

    description = "MobileNetV2-like classifier"
    instances = 2                      # parallel executors, each with its own session
    evictable = true                   # may be unloaded to make room for another model

    [version_policy]
    latest = 1                         # or: all = true, or: specific = [3, 5]

    [batching]
    max_batch_size = 32                # rows per batch; 0 turns batching off
    tune = true                        # measure at load which batch sizes pay, cap at that
    preferred_batch_sizes = [8, 16]
    max_queue_delay_us = 500
    max_queue_size = 256               # requests waiting; more get 503 + Retry-After
    default_timeout_us = 0             # 0: no queue timeout
    priority_levels = 2                # 1 is the highest
    preserve_ordering = false

    [placement]                        # pin instead of the profile's preferences
    runtime = "openvino"
    device = "CPU"

    [pipeline]                         # steps around the model (common/pipeline_config.py)
"""

from __future__ import annotations

import re
import tomllib
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from common.pipeline_config import PipelineConfig
from common.protocol.capture import MAX_SAMPLE_BYTES
from common.protocol.ground_truth import GroundTruthTask
from runtimes.errors import validation_message
from runtimes.hardware.select import Pin

CONFIG_FILE = "config.toml"


class ModelConfigError(ValueError):
    """A model's config.toml is unreadable or invalid; the message names file and field."""

    code = "model_config_invalid"


_LABEL = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,63}")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BatchingConfig(_Strict):
    max_batch_size: int = Field(default=32, ge=0)
    """Most rows in one batch; 0 runs every request on its own."""
    tune: bool | None = None
    """At load, measure the instances' rows per second at batch sizes 1, 2, 4, ... up to
    ``max_batch_size`` and serve with the largest size reached by steps that each gained 5 %;
    where a batch of two gains less than that, requests run one at a time
    (:mod:`agent.inference.tuning`). None (the default) measures where ``max_batch_size`` is
    not given (a size written is the size served), true always, false never: whether a batch
    pays depends on the device (on some CPUs two rows of a CNN cost as much as two single
    rows). Costs up to half a second of load time, and at least two runs at one row and two
    at two; with ``runtime.cache_dir`` a restart reuses what was measured (agent/inference/
    tuning_cache.py). The model's metadata and config give the result."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """Batch sizes to run at once when they can be formed, without waiting the delay."""
    max_queue_delay_us: int = Field(default=0, ge=0)
    """Longest a request waits for others to fill a batch once an instance is free."""
    balance_batches: bool = True
    """With no ``max_queue_delay_us``: when an instance frees holding fewer rows than recent
    batches had, wait for the rest (at most a quarter of a batch's compute time, 20 ms at
    most), so that a closed loop of clients settles into equal batches instead of a lone
    request alternating with all the others."""
    max_queue_size: int = Field(default=256, ge=1)
    """Requests that may wait; a full queue answers 503 with Retry-After at once."""
    default_timeout_us: int = Field(default=0, ge=0)
    """Queue timeout of requests that give none; 0 means none."""
    priority_levels: int = Field(default=1, ge=1, le=16)
    """Number of priority levels; 1 is the highest and runs first."""
    default_priority_level: int = Field(default=0, ge=0)
    """Level of requests without a priority; 0 picks the middle level."""
    preserve_ordering: bool = False
    """Answer requests in the order they arrived, even with several instances."""

    @model_validator(mode="after")
    def _consistent(self) -> BatchingConfig:
        too_big = [
            s for s in self.preferred_batch_sizes if s < 1 or s > max(self.max_batch_size, 1)
        ]
        if too_big:
            raise ValueError(f"preferred_batch_sizes {too_big} must lie in 1..max_batch_size")
        if self.default_priority_level > self.priority_levels:
            raise ValueError("default_priority_level must not exceed priority_levels")
        return self

    @property
    def measured(self) -> bool:
        """Whether the batch size is measured at load (:attr:`tune`)."""
        if self.tune is not None:
            return self.tune
        return "max_batch_size" not in self.model_fields_set

    @property
    def default_priority(self) -> int:
        return self.default_priority_level or (self.priority_levels + 1) // 2


class VersionPolicy(_Strict):
    """Which versions are served: the newest N, all, or named ones (TF Serving's policies)."""

    latest: int | None = Field(default=None, ge=1)
    all: bool = False
    specific: tuple[int, ...] = ()

    @model_validator(mode="after")
    def _one_kind(self) -> VersionPolicy:
        kinds = (self.latest is not None) + self.all + bool(self.specific)
        if kinds > 1:
            raise ValueError("give only one of latest, all, specific")
        return self

    def select(self, available: list[int]) -> list[int]:
        ordered = sorted(available)
        if self.all:
            return ordered
        if self.specific:
            return [v for v in ordered if v in self.specific]
        return ordered[-(self.latest or 1) :]


class WarmupConfig(_Strict):
    golden: bool = True
    """Run the version's golden.npz at load; the version is ready only if it matches."""
    require_golden: bool = False
    """Refuse to load a version that has no golden.npz."""


class PayloadLogMode(StrEnum):
    DIGEST = "digest"
    """Each tensor's datatype, shape and SHA-256."""
    TENSORS = "tensors"
    """The digest and the tensor's bytes (base64), where they fit ``max_tensor_bytes``."""


class PayloadLogConfig(_Strict):
    """Log this model's requests and responses (docs/agent.md, "Payload logging"); where the
    records go is the agent's ``[payload_log]``."""

    enabled: bool = False
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Fraction of answered requests recorded."""
    mode: PayloadLogMode = PayloadLogMode.DIGEST
    max_tensor_bytes: int = Field(default=65536, ge=0)
    """In ``tensors`` mode, a tensor larger than this is logged as its digest only."""


class TfServingConfig(_Strict):
    """TensorFlow Serving's ``:classify`` and ``:regress`` for this model (docs/local-apps.md):
    which output answers them. Without it both answer 400 naming this section."""

    classify_output: str | None = None
    """The output holding one score per class for each example: ``:classify`` answers
    ``[label, score]`` pairs, in the model's class order."""
    labels_file: str | None = None
    """A file of the version folder with one class label per line; without it, classes are
    named by their index."""
    regress_output: str | None = None
    """The output holding one value per example: ``:regress`` answers it."""
    version_labels: dict[str, int] = Field(default_factory=dict)
    """TF Serving's version labels, ``label = version``: ``/v1/models/M/labels/L`` (status,
    metadata, ``:predict``, ``:classify``, ``:regress``) answers with that version. A label of
    a version not served here answers 404, as TF Serving's unavailable version does."""

    @model_validator(mode="after")
    def _label_names(self) -> TfServingConfig:
        for label, version in self.version_labels.items():
            if not _LABEL.fullmatch(label):
                raise ValueError(
                    f"version label {label!r}: letters, digits, '.', '_' and '-', "
                    "starting with a letter, at most 64"
                )
            if version < 1:
                raise ValueError(f"version label {label!r}: version {version} is not >= 1")
        return self


class GroundTruthConfig(_Strict):
    """Keep this model's predictions so apps can post their true outcomes later
    (docs/model-quality.md, "Ground truth and live accuracy"). Off unless ``task`` is set."""

    task: GroundTruthTask | None = None
    """classification: the top-1 class of each row is kept; regression: its first value."""
    output: str | None = None
    """The output judged; the model's first output when unset."""


class CaptureConfig(_Strict):
    """Keep sampled requests and answers for retraining (docs/model-quality.md, "Data
    capture"). Off unless ``enabled``."""

    enabled: bool = False
    sample_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Fraction of answered requests captured whatever their outputs."""
    low_confidence_below: float | None = Field(default=None, gt=0.0, le=1.0)
    """Capture the rows whose top-1 probability (of the first ``[N, classes]`` output,
    softmaxed where it does not hold probabilities) is below this; None: no such trigger."""
    shadow_disagreement: bool = False
    """Capture the requests whose shadow candidate's top-1 disagreed with the served one."""
    max_sample_bytes: int = Field(default=64 * 1024, ge=1, le=MAX_SAMPLE_BYTES)
    """A sample larger than this (its tensors, compressed) is dropped and counted."""
    max_samples_per_minute: int = Field(default=60, ge=1, le=100_000)
    """Samples kept per minute at most; more are dropped and counted."""
    max_disk_bytes: int = Field(default=64 * 2**20, ge=1024)
    """The model's spool on the device; past it the oldest samples go first (counted)."""
    retention_days: float = Field(default=7.0, gt=0.0)
    """Samples not uploaded within this are deleted (counted as expired)."""

    @model_validator(mode="after")
    def _captures_something(self) -> CaptureConfig:
        nothing = (
            not self.sample_rate
            and self.low_confidence_below is None
            and not self.shadow_disagreement
        )
        if self.enabled and nothing:
            raise ValueError(
                "sample_rate: 0 with no low_confidence_below or shadow_disagreement "
                "captures nothing"
            )
        return self


class ModelConfig(_Strict):
    description: str = ""
    """Free text shown in metadata."""
    placement: Pin | None = None
    """Pin the model to a runtime (and device) instead of the profile's preference order."""
    instances: int = Field(default=0, ge=0, le=64)
    """Parallel executors, each with its own session; CPU threads are split between them.
    0 (the default) leaves the count to the agent: on a CPU one per core, at most 4, each
    single-threaded; on another device one (:mod:`agent.inference.tuning`)."""
    evictable: bool = False
    """May be unloaded (when idle) to make room for another model within the memory budget."""
    memory_mb: int | None = Field(default=None, gt=0)
    """Memory one instance needs; estimated from the model files when not given."""
    version_policy: VersionPolicy = VersionPolicy()
    batching: BatchingConfig = BatchingConfig()
    warmup: WarmupConfig = WarmupConfig()
    pipeline: PipelineConfig | None = None
    """Processing steps and model calls served as this model (docs/pipelines.md); a
    version's own pipeline.toml takes its place for that version."""
    payload_log: PayloadLogConfig = PayloadLogConfig()
    """A sampled log of this model's request and response tensors (off by default)."""
    tfserving: TfServingConfig = TfServingConfig()
    """The outputs TF Serving's ``:classify`` and ``:regress`` read."""
    ground_truth: GroundTruthConfig = GroundTruthConfig()
    """Keep predictions for outcomes posted later (off by default)."""
    capture: CaptureConfig = CaptureConfig()
    """Sampled request and response tensors kept for retraining (off by default)."""


def parse_model_config(text: str, source: str) -> ModelConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ModelConfigError(f"{source}: invalid TOML: {exc}") from exc
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        raise ModelConfigError(f"{source}: {validation_message(exc)}") from exc


def load_model_config(model_dir: Path) -> ModelConfig:
    path = model_dir / CONFIG_FILE
    if not path.is_file():
        return ModelConfig()
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{path}: cannot read: {exc}") from exc
    return parse_model_config(text, str(path))


def version_dirs(model_dir: Path) -> list[Path]:
    """Numeric version directories of a model, oldest first."""
    versions = [
        p for p in model_dir.iterdir() if p.is_dir() and p.name.isascii() and p.name.isdigit()
    ]
    return sorted(versions, key=lambda p: int(p.name))
