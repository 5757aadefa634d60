"""A pipeline: processing steps and model calls around a model, served as a model.

It lives in ``[pipeline]`` of a model's ``config.toml`` (every version), or in a version's own
``pipeline.toml`` (that version only, shipped, signed and rolled out with it; it wins). Tensors
are named: each step reads pipeline tensors and writes new ones, as Triton's ensemble steps
map them with ``input_map``/``output_map``; steps run in the order given, so a step can only
read what the request carries or an earlier step wrote (which makes it a DAG)::

    inputs = [{ name = "image", datatype = "BYTES", shape = [-1] }]
    outputs = [{ name = "labels", datatype = "BYTES", shape = [-1, 5] }]

    [[pipeline.steps]]
    kind = "decode_image"
    input = "image"
    output = "decoded"

    [[pipeline.steps]]
    kind = "model"                 # model = "" is this version's own model file
    inputs = { input = "pixels" }  # the model's tensor = the pipeline's tensor
    outputs = { logits = "logits" }
"""

from __future__ import annotations

import re
import tomllib
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from runtimes.datatypes import V2_DATATYPES
from runtimes.errors import validation_message

PIPELINE_FILE = "pipeline.toml"
PIPELINE_GOLDEN_FILE = "pipeline_golden.npz"
"""The pipeline's golden sample (its inputs, e.g. a JPEG, and its outputs) in a version."""
PIPELINE_FILES = re.compile(
    r"^(pipeline\.toml|pipeline_golden\.npz|[A-Za-z0-9_][A-Za-z0-9_.-]*\.(txt|py))$"
)
"""A pipeline's files besides the model (docs/pipelines.md): its steps, its golden sample,
labels files and Python steps; uploaded before the model file, which completes a variant."""

_NAME = r"^[A-Za-z0-9_.-]{1,64}$"
_FILE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"  # a plain name in the version directory


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Step(_Strict):
    name: str = Field(default="", pattern=r"^([A-Za-z0-9_-]{1,64})?$")
    """Named in errors, Server-Timing and metrics; default ``<index>_<kind>``."""
    timeout_s: float | None = Field(default=None, gt=0)
    """Longest the step may take; default the agent's ``pipelines.step_timeout_s``."""

    def reads(self) -> list[str]:
        raise NotImplementedError

    def writes(self) -> list[str]:
        raise NotImplementedError


class _Unary(_Step):
    """A step of one tensor in, one out."""

    input: str
    output: str

    def reads(self) -> list[str]:
        return [self.input]

    def writes(self) -> list[str]:
        return [self.output]


class DecodeImage(_Unary):
    """BYTES (JPEG, PNG) -> images; the agent's ``max_image_pixels`` applies (413 beyond)."""

    kind: Literal["decode_image"]
    mode: Literal["RGB", "L"] = "RGB"


class Resize(_Unary):
    kind: Literal["resize"]
    size: tuple[int, int] | None = None
    """[height, width]; unset: the height and width of the own model's image input, so a
    version whose model takes another size needs no new configuration."""
    shorter_side: int | None = Field(default=None, gt=0)
    """Scale the shorter side to this, keeping the aspect (then crop); instead of size."""
    resample: Literal["nearest", "bilinear", "bicubic"] = "bilinear"

    @model_validator(mode="after")
    def _one(self) -> Resize:
        if self.size is not None and self.shorter_side is not None:
            raise ValueError("give size or shorter_side, not both")
        if self.size is not None and min(self.size) < 1:
            raise ValueError("size must be positive")
        return self


class CenterCrop(_Unary):
    kind: Literal["center_crop"]
    size: tuple[int, int] | None = None
    """[height, width]; unset: the own model's image input size."""


class Normalize(_Unary):
    """``(pixel * scale - mean) / std`` per channel (the last axis), as FP32."""

    kind: Literal["normalize"]
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    scale: float = 1 / 255

    @model_validator(mode="after")
    def _positive(self) -> Normalize:
        if not self.std or any(s == 0 for s in self.std):
            raise ValueError("std must not be 0")
        return self


class Layout(_Unary):
    """Images are NHWC after decoding; NCHW for most ONNX vision models."""

    kind: Literal["layout"]
    to: Literal["NCHW", "NHWC"]


class Cast(_Unary):
    kind: Literal["cast"]
    datatype: str

    @model_validator(mode="after")
    def _known(self) -> Cast:
        if self.datatype not in V2_DATATYPES - {"BYTES", "BF16"}:
            raise ValueError(f"datatype {self.datatype!r} is not a numeric V2 datatype")
        return self


class Softmax(_Unary):
    kind: Literal["softmax"]


class Argmax(_Unary):
    """Index of the largest value on the last axis, INT64."""

    kind: Literal["argmax"]


class Threshold(_Unary):
    """``value >= threshold``, BOOL."""

    kind: Literal["threshold"]
    threshold: float


class TopK(_Step):
    """The k largest values on the last axis, best first; outputs by role."""

    kind: Literal["topk"]
    input: str
    k: int = Field(ge=1)
    labels_file: str | None = Field(default=None, pattern=_FILE)
    """One label per line, in the version directory; index i is line i."""
    scores: str | None = None
    """Output tensor of the scores (the input's dtype)."""
    indices: str | None = None
    """Output tensor of the indices (INT64)."""
    labels: str | None = None
    """Output tensor of the labels (BYTES); needs labels_file."""

    @model_validator(mode="after")
    def _some_output(self) -> TopK:
        if not (self.scores or self.indices or self.labels):
            raise ValueError("give at least one of scores, indices, labels")
        if self.labels and not self.labels_file:
            raise ValueError("labels needs labels_file")
        return self

    def reads(self) -> list[str]:
        return [self.input]

    def writes(self) -> list[str]:
        return [t for t in (self.scores, self.indices, self.labels) if t]


class ModelStep(_Step):
    """A call to a model, through that model's own batcher."""

    kind: Literal["model"]
    model: str = ""
    """A model the agent serves; empty: this version's own model file."""
    version: str = ""
    """Its version; empty: the newest it serves."""
    inputs: dict[str, str] = Field(min_length=1)
    """Model tensor = pipeline tensor (Triton's input_map)."""
    outputs: dict[str, str] = Field(min_length=1)
    """Model tensor = pipeline tensor (Triton's output_map)."""

    def reads(self) -> list[str]:
        return list(self.inputs.values())

    def writes(self) -> list[str]:
        return list(self.outputs.values())


class PythonStep(_Step):
    """A user's Python file in the version directory, run in a worker process; runs only
    where the agent's ``pipelines.python_steps`` allows it (see docs/pipelines.md)."""

    kind: Literal["python"]
    file: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,124}\.py$")
    inputs: dict[str, str] = Field(min_length=1)
    """Step tensor = pipeline tensor."""
    outputs: dict[str, str] = Field(min_length=1)
    """Step tensor = pipeline tensor."""
    parameters: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """Given to the file's ``setup(parameters)``."""
    network: bool = False
    """Whether the step may use the network; off, its worker has no network interface at all
    (where the host lets the agent make namespaces, docs/pipelines.md)."""

    def reads(self) -> list[str]:
        return list(self.inputs.values())

    def writes(self) -> list[str]:
        return list(self.outputs.values())


Step = Annotated[
    DecodeImage
    | Resize
    | CenterCrop
    | Normalize
    | Layout
    | Cast
    | Softmax
    | Argmax
    | Threshold
    | TopK
    | ModelStep
    | PythonStep,
    Field(discriminator="kind"),
]


class TensorConfig(_Strict):
    name: str = Field(pattern=_NAME)
    datatype: str
    shape: tuple[int, ...]
    """-1 for a dynamic dimension; a leading -1 on every tensor is the batch."""

    @model_validator(mode="after")
    def _known(self) -> TensorConfig:
        if self.datatype not in V2_DATATYPES - {"BF16"}:
            raise ValueError(f"datatype {self.datatype!r} is not a V2 datatype")
        if any(d < -1 for d in self.shape):
            raise ValueError("shape entries are sizes or -1")
        return self


class PipelineConfig(_Strict):
    inputs: tuple[TensorConfig, ...] = Field(min_length=1)
    """What a request carries (its V2 metadata)."""
    outputs: tuple[TensorConfig, ...] = Field(min_length=1)
    """What the answer holds, written by the steps."""
    steps: tuple[Step, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _wired(self) -> PipelineConfig:
        known = {t.name for t in self.inputs}
        if len(known) != len(self.inputs):
            raise ValueError("inputs: tensor names must be unique")
        names: set[str] = set()
        for i, step in enumerate(self.steps):
            name = step_name(i, step)
            if name in names:
                raise ValueError(f"steps[{i}].name: {name!r} is used by an earlier step")
            names.add(name)
            for tensor in step.reads():
                if tensor not in known:
                    raise ValueError(
                        f"steps[{i}] ({name}) reads {tensor!r}, which is neither a pipeline "
                        "input nor written by an earlier step"
                    )
            for tensor in step.writes():
                if tensor in known:
                    raise ValueError(f"steps[{i}] ({name}) writes {tensor!r}, already written")
                known.add(tensor)
        for t in self.outputs:
            if t.name not in known:
                raise ValueError(f"outputs: no step writes {t.name!r}")
        return self

    def named_steps(self) -> list[tuple[str, Step]]:
        return [(step_name(i, s), s) for i, s in enumerate(self.steps)]


def step_name(index: int, step: Step) -> str:
    return step.name or f"{index}_{step.kind}"


class PipelineConfigError(ValueError):
    """A pipeline.toml is unreadable or invalid; the message names file and field."""

    code = "model_config_invalid"


def parse_pipeline(text: str, source: str) -> PipelineConfig:
    """Parse a version's ``pipeline.toml`` (the keys of ``[pipeline]``, at top level)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PipelineConfigError(f"{source}: invalid TOML: {exc}") from exc
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise PipelineConfigError(f"{source}: {validation_message(exc)}") from exc
