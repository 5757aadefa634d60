"""The built-in pipeline steps, bound to their configuration: blocking functions of numpy
arrays, shared by the agent (which serves pipelines) and the control plane (which validates
them). Images travel between image steps as object arrays of Pillow images (sizes may differ
until a resize); a numeric step stacks them into ``[N, H, W, C]`` uint8 first.

Errors carry a stable ``code``; ``agent/api/errors.py`` maps them to statuses::

    StepError                 code
    +-- StepInputError        step_input_invalid    400: what a step got is not usable
    +-- ImageTooLargeError    image_too_large       413: past pipelines.max_image_pixels or
    |                                                      max_request_pixels
    +-- DecodeBusyError       decode_budget_full    503: the images decoded across requests
    |                                                      hold pipelines.max_decoded_pixels
    +-- StepFailedError       step_failed           422: a step raised (its message)
    +-- StepCrashedError      step_crashed          502: a Python step's worker died
    +-- StepTimeoutError      step_timeout          504: a step passed its timeout

Each message names the step.
"""

from __future__ import annotations

import io
import threading
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from common.pipeline_config import (
    Argmax,
    Cast,
    CenterCrop,
    DecodeImage,
    Layout,
    ModelStep,
    Normalize,
    PipelineConfig,
    PythonStep,
    Resize,
    Softmax,
    Threshold,
    TopK,
)
from runtimes.datatypes import numpy_dtype
from runtimes.signature import DYNAMIC, ModelSignature


class StepError(Exception):
    code = "step_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class StepInputError(StepError):
    code = "step_input_invalid"


class ImageTooLargeError(StepError):
    code = "image_too_large"


class DecodeBusyError(StepError):
    """The images of requests in flight hold the decode budget: retry in a moment."""

    code = "decode_budget_full"
    retry_after_s = 1


class StepFailedError(StepError):
    code = "step_failed"


class StepCrashedError(StepError):
    code = "step_crashed"


class StepTimeoutError(StepError):
    code = "step_timeout"


Arrays = dict[str, np.ndarray]
StepFn = Callable[[Arrays], Arrays]
Builtin = DecodeImage | Resize | CenterCrop | Normalize | Layout | Cast | Softmax | Argmax
BuiltinStep = Builtin | Threshold | TopK

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
}


def bind(
    name: str,
    step: BuiltinStep,
    version_dir: Path,
    image_size: tuple[int, int] | None,
    max_pixels: int,
    max_request_pixels: int,
    budget: DecodeBudget | None = None,
) -> StepFn:
    """The step as a function; ``image_size`` (height, width) is the own model's image input
    size, for a resize or crop that gives none.

    Raises:
        ValueError: the step cannot be bound (no size known, an unreadable labels file).
    """
    match step:
        case DecodeImage():
            return _one(
                step.input,
                step.output,
                lambda x: _decode(name, x, step.mode, max_pixels, max_request_pixels, budget),
            )
        case Resize():
            size = step.size or (None if step.shorter_side else image_size)
            if size is None and step.shorter_side is None:
                raise ValueError(f"step {name}: no size, and the model has no image input")
            method = _RESAMPLE[step.resample]
            return _one(
                step.input, step.output, lambda x: _resize(name, x, size, step.shorter_side, method)
            )
        case CenterCrop():
            crop = step.size or image_size
            if crop is None:
                raise ValueError(f"step {name}: no size, and the model has no image input")
            return _one(step.input, step.output, lambda x: _crop(name, x, crop))
        case Normalize():
            mean = np.asarray(step.mean, np.float32)
            std = np.asarray(step.std, np.float32)
            scale = np.float32(step.scale)
            return _one(
                step.input,
                step.output,
                lambda x: ((_numeric(name, x) * scale - mean) / std).astype(np.float32),
            )
        case Layout():
            order = (0, 3, 1, 2) if step.to == "NCHW" else (0, 2, 3, 1)
            return _one(
                step.input,
                step.output,
                lambda x: np.ascontiguousarray(_rank(name, _numeric(name, x), 4).transpose(order)),
            )
        case Cast():
            dtype = numpy_dtype(step.datatype)
            return _one(step.input, step.output, lambda x: _numeric(name, x).astype(dtype))
        case Softmax():
            return _one(step.input, step.output, lambda x: _softmax(_numeric(name, x)))
        case Argmax():
            return _one(
                step.input,
                step.output,
                lambda x: np.argmax(_numeric(name, x), axis=-1).astype(np.int64),
            )
        case Threshold():
            return _one(step.input, step.output, lambda x: _numeric(name, x) >= step.threshold)
        case TopK():
            labels = _labels(version_dir / step.labels_file) if step.labels_file else None
            return lambda t: _topk(name, step, t[step.input], labels)
    raise AssertionError(f"not a built-in step: {step!r}")


def _one(source: str, target: str, fn: Callable[[np.ndarray], np.ndarray]) -> StepFn:
    return lambda tensors: {target: fn(tensors[source])}


class DecodeBudget:
    """Pixels of decoded images alive at once across every request: a decode takes its
    request's share before it decodes, and gives it back when its images are let go (their
    array is collected), whatever the pipeline does with them meanwhile."""

    def __init__(self, max_pixels: int) -> None:
        self.max_pixels = max_pixels
        self.held = 0
        self._lock = threading.Lock()

    def take(self, name: str, pixels: int, images: np.ndarray) -> None:
        """Hold ``pixels`` while ``images`` lives.

        Raises:
            DecodeBusyError: the budget cannot hold them now.
        """
        with self._lock:
            if self.held and self.held + pixels > self.max_pixels:
                raise DecodeBusyError(
                    f"step {name}: {self.held} pixels of other requests' images are decoded; "
                    f"{pixels} more would pass pipelines.max_decoded_pixels "
                    f"({self.max_pixels}); retry",
                    field=name,
                )
            self.held += pixels
        weakref.finalize(images, self._give_back, pixels)

    def _give_back(self, pixels: int) -> None:
        with self._lock:
            self.held -= pixels


def _open(name: str, i: int, item: object, max_pixels: int) -> Image.Image:
    """Image ``i`` opened (its header read, nothing decoded), within ``max_pixels``."""
    if not isinstance(item, bytes):
        raise StepInputError(f"step {name}: element {i} is not bytes", field=name)
    try:
        with warnings.catch_warnings():
            # NOTE: Pillow warns (DecompressionBombWarning) before our own limit applies
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(item))
    except Image.DecompressionBombError as exc:  # past twice Pillow's own limit
        raise ImageTooLargeError(
            f"step {name}: image {i} is larger than the limit of {max_pixels} pixels "
            f"(pipelines.max_image_pixels): {exc}",
            field=name,
        ) from None
    except UnidentifiedImageError:
        raise StepInputError(
            f"step {name}: image {i} is not a JPEG or PNG image ({len(item)} bytes)", field=name
        ) from None
    except (OSError, ValueError) as exc:
        raise StepInputError(f"step {name}: image {i} cannot be read: {exc}", field=name) from None
    pixels = image.width * image.height  # from the header: nothing decoded yet
    if pixels > max_pixels:
        raise ImageTooLargeError(
            f"step {name}: image {i} is {image.width}x{image.height} = {pixels} pixels, "
            f"more than the limit of {max_pixels} (pipelines.max_image_pixels)",
            field=name,
        )
    if image.format not in ("JPEG", "PNG"):
        raise StepInputError(
            f"step {name}: image {i} is {image.format}, not JPEG or PNG", field=name
        )
    return image


def _decode(
    name: str,
    data: np.ndarray,
    mode: str,
    max_pixels: int,
    max_request_pixels: int,
    budget: DecodeBudget | None,
) -> np.ndarray:
    """Decode every image of a request, once all their headers are read and their pixels
    together are within ``max_request_pixels``: ten images each under ``max_image_pixels``
    would otherwise hold ten times that decoded."""
    if data.dtype != object:
        raise StepInputError(f"step {name}: expects BYTES (encoded images), got {data.dtype}")
    opened, total = [], 0
    for i, item in enumerate(data.reshape(-1)):
        image = _open(name, i, item, max_pixels)
        total += image.width * image.height
        if total > max_request_pixels:
            raise ImageTooLargeError(
                f"step {name}: images 0-{i} are {total} pixels together, more than the limit "
                f"of {max_request_pixels} a request (pipelines.max_request_pixels)",
                field=name,
            )
        opened.append(image)
    out = np.empty(data.size, dtype=object)
    if budget is not None:
        budget.take(name, total, out)
    for i, image in enumerate(opened):
        try:
            out[i] = image.convert(mode)
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise StepInputError(
                f"step {name}: image {i} cannot be decoded: {exc}", field=name
            ) from None
    return out


def _images(name: str, x: np.ndarray) -> list[Image.Image]:
    items = list(x.reshape(-1)) if x.dtype == object else []
    if not items or not all(isinstance(i, Image.Image) for i in items):
        raise StepInputError(f"step {name}: expects decoded images", field=name)
    return items


def _resize(
    name: str,
    x: np.ndarray,
    size: tuple[int, int] | None,
    shorter: int | None,
    method: Image.Resampling,
) -> np.ndarray:
    out = np.empty(x.size, dtype=object)
    for i, image in enumerate(_images(name, x)):
        if size is not None:
            height, width = size
        else:
            assert shorter is not None  # bound with one of the two
            ratio = shorter / min(image.width, image.height)
            width, height = round(image.width * ratio), round(image.height * ratio)
        out[i] = image.resize((width, height), method)
    return out


def _crop(name: str, x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    height, width = size
    out = np.empty(x.size, dtype=object)
    for i, image in enumerate(_images(name, x)):
        if image.width < width or image.height < height:
            raise StepInputError(
                f"step {name}: image {i} is {image.width}x{image.height}, smaller than the "
                f"crop {width}x{height}",
                field=name,
            )
        left, top = (image.width - width) // 2, (image.height - height) // 2
        out[i] = image.crop((left, top, left + width, top + height))
    return out


def _numeric(name: str, x: np.ndarray) -> np.ndarray:
    """``x`` itself, or its images stacked as ``[N, H, W, C]`` uint8."""
    if x.dtype != object:
        return x
    arrays = [np.asarray(image) for image in _images(name, x)]
    if len({a.shape for a in arrays}) > 1:
        raise StepInputError(
            f"step {name}: images differ in size ({sorted({a.shape for a in arrays})}); "
            "resize them first",
            field=name,
        )
    stacked = np.stack(arrays)
    return stacked[..., None] if stacked.ndim == 3 else stacked


def _rank(name: str, x: np.ndarray, rank: int) -> np.ndarray:
    if x.ndim != rank:
        raise StepInputError(f"step {name}: expects rank {rank}, got shape {list(x.shape)}")
    return x


def _softmax(x: np.ndarray) -> np.ndarray:
    shifted = np.exp(x - np.max(x, axis=-1, keepdims=True))
    out: np.ndarray = (shifted / np.sum(shifted, axis=-1, keepdims=True)).astype(x.dtype)
    return out


def _topk(name: str, step: TopK, tensors: np.ndarray, labels: list[bytes] | None) -> Arrays:
    x = _numeric(name, tensors)
    k = min(step.k, x.shape[-1]) if x.ndim else 0
    if k == 0:
        raise StepInputError(f"step {name}: expects a tensor of scores, got a scalar")
    # stable: equal scores keep the lower index first, the same answer as a reference sort
    indices = np.argsort(-x, axis=-1, kind="stable")[..., :k].astype(np.int64)
    out: Arrays = {}
    if step.scores:
        out[step.scores] = np.take_along_axis(x, indices, axis=-1)
    if step.indices:
        out[step.indices] = indices
    if step.labels:
        assert labels is not None  # the config requires labels_file with labels
        table = np.array(labels + [b""], dtype=object)
        picked = np.where(indices < len(labels), indices, len(labels))
        out[step.labels] = table[picked]
    return out


def _labels(path: Path) -> list[bytes]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"labels file {path} cannot be read: {exc}") from exc
    return [line.strip().encode() for line in text.splitlines()]


def image_input_size(
    config: PipelineConfig, signature: ModelSignature | None
) -> tuple[int, int] | None:
    """Height and width of the own model's first image input (rank 4), if fixed; the layout
    is NCHW when a layout step makes it so, else NHWC."""
    if signature is None:
        return None
    nchw = any(isinstance(s, Layout) and s.to == "NCHW" for s in config.steps)
    for spec in signature.inputs:
        if len(spec.shape) == 4:
            height, width = spec.shape[2:4] if nchw else spec.shape[1:3]
            if DYNAMIC not in (height, width):
                return height, width
    return None


def run_offline(
    config: PipelineConfig,
    version_dir: Path,
    inputs: Arrays,
    signature: ModelSignature,
    infer: Callable[[Arrays], Arrays],
    at_model: Callable[[Arrays, Arrays], None] | None = None,
) -> Arrays:
    """Run the steps one after the other, the version's own model through ``infer`` (a
    runtime's): the self-test of ``edgefleet models selftest`` and of the control plane's
    validation. Python steps and calls to other models need an agent. ``at_model`` is given
    what enters and leaves the own model (a pipeline's drift reference).

    Raises:
        StepError: a step failed, or needs an agent.
        ValueError: a step cannot be bound.
    """
    size = image_input_size(config, signature)
    tensors = dict(inputs)
    for name, step in config.named_steps():
        if isinstance(step, PythonStep):
            raise StepFailedError(f"step {name}: Python steps run only in an agent")
        if isinstance(step, ModelStep):
            if step.model:
                raise StepFailedError(f"step {name}: model {step.model!r} is served by agents")
            given = {inner: tensors[outer] for inner, outer in step.inputs.items()}
            outputs = infer(given)
            if at_model is not None:
                at_model(given, outputs)
            missing = [inner for inner in step.outputs if inner not in outputs]
            if missing:
                raise StepFailedError(f"step {name}: the model gave no {missing[0]!r}")
            tensors |= {outer: outputs[inner] for inner, outer in step.outputs.items()}
        else:
            tensors |= bind(name, step, version_dir, size, 2**31, 2**31)(tensors)
    return {t.name: tensors[t.name] for t in config.outputs}
