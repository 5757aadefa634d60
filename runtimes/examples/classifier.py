"""The ``classifier`` example: a pipeline around the example CNN that takes JPEG bytes.

JPEG -> decode -> resize to the model's input -> normalise (ImageNet mean/std) -> NCHW ->
``cnn`` -> softmax -> top-5 with ``labels.txt``. Its steps and labels are files of the
version, so a new version (another input size, other labels) ships its own. The golden
sample (``pipeline_golden.npz``) holds a synthetic JPEG made here with Pillow and the top-5
that ONNX Runtime gives for it; there is no model-level ``golden.npz``, since the version's
requests (and so a fleet's self-test) are JPEGs, not tensors.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
from PIL import Image

from runtimes.examples.onnx_models import cnn_onnx
from runtimes.examples.weights import SEED, cnn_layers
from runtimes.golden import GoldenSample

PIPELINE_GOLDEN_FILE = "pipeline_golden.npz"  # as common.pipeline_config names it
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
TOP_K = 5
LABELS = [f"class_{i:04d}" for i in range(1000)]

PIPELINE_TOML = f"""\
# The classifier's steps: shipped, signed and rolled out with this version.
inputs = [{{ name = "image", datatype = "BYTES", shape = [-1] }}]
outputs = [
    {{ name = "labels", datatype = "BYTES", shape = [-1, {TOP_K}] }},
    {{ name = "scores", datatype = "FP32", shape = [-1, {TOP_K}] }},
]

[[steps]]
name = "decode"
kind = "decode_image"
input = "image"
output = "decoded"

[[steps]]
name = "resize"          # no size: the model's own input size
kind = "resize"
input = "decoded"
output = "resized"

[[steps]]
name = "normalize"
kind = "normalize"
input = "resized"
output = "normalized"
mean = {list(MEAN)}
std = {list(STD)}

[[steps]]
name = "layout"
kind = "layout"
input = "normalized"
output = "pixels"
to = "NCHW"

[[steps]]
name = "cnn"
kind = "model"
inputs = {{ input = "pixels" }}
outputs = {{ logits = "logits" }}

[[steps]]
name = "softmax"
kind = "softmax"
input = "logits"
output = "probabilities"

[[steps]]
name = "top5"
kind = "topk"
input = "probabilities"
k = {TOP_K}
labels_file = "labels.txt"
labels = "labels"
scores = "scores"
"""


def golden_jpeg(width: int = 320, height: int = 240, seed: int = SEED + 20) -> bytes:
    """A synthetic photo-like JPEG (smooth colours and some noise), the same every time; the
    seed is one whose top six classes lie clearly apart (no near tie to swap between runtimes)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width] / max(width, height)
    pattern = np.stack([np.sin(9 * xx) * np.cos(4 * yy), np.cos(7 * yy), xx - yy], axis=-1)
    noise = rng.normal(0.0, 0.15, (height, width, 3))
    pixels = np.clip((pattern + noise + 1.0) * 127.5, 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def preprocess(jpegs: list[bytes], image_size: int) -> np.ndarray:
    """What the classifier's steps do before the model, with Pillow and numpy directly."""
    rows = []
    for data in jpegs:
        image = Image.open(io.BytesIO(data)).convert("RGB")
        image = image.resize((image_size, image_size), Image.Resampling.BILINEAR)
        scaled = np.asarray(image, np.float32) * np.float32(1 / 255)
        rows.append((scaled - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32))
    return np.ascontiguousarray(np.stack(rows).transpose(0, 3, 1, 2)).astype(np.float32)


def top_k(logits: np.ndarray, k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """Labels (BYTES) and softmax scores of the k best classes, best first."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    scores = (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)
    indices = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
    table = np.array([label.encode() for label in LABELS], dtype=object)
    return table[indices], np.take_along_axis(scores, indices, axis=-1)


def write_classifier(version_dir: Path, image_size: int = 224) -> None:
    """Write one classifier version: model.onnx, pipeline.toml, labels.txt and the golden."""
    from runtimes.backends import open_model  # the reference answer is ONNX Runtime's
    from runtimes.base import Placement

    convs, head = cnn_layers()
    model_path = version_dir / "model.onnx"
    onnx.save(cnn_onnx(convs, head, image_size), model_path)
    (version_dir / "pipeline.toml").write_text(PIPELINE_TOML)
    (version_dir / "labels.txt").write_text("\n".join(LABELS) + "\n")
    jpeg = golden_jpeg()
    runtime = open_model(
        model_path, Placement(runtime="onnxruntime", providers=("CPUExecutionProvider",))
    )
    try:
        logits = runtime.infer({"input": preprocess([jpeg], image_size)})["logits"]
    finally:
        runtime.close()
    labels, scores = top_k(logits)
    image = np.empty(1, dtype=object)
    image[0] = jpeg
    GoldenSample({"image": image}, {"labels": labels, "scores": scores}, rtol=1e-2, atol=1e-5).save(
        version_dir / PIPELINE_GOLDEN_FILE
    )
