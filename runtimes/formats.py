"""Model file formats and how a version directory names its model file."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from runtimes.errors import ModelFileError


class ModelFormat(StrEnum):
    ONNX = "onnx"
    OPENVINO_IR = "openvino_ir"
    TFLITE = "tflite"


_SUFFIXES = {
    ".onnx": ModelFormat.ONNX,
    ".xml": ModelFormat.OPENVINO_IR,
    ".tflite": ModelFormat.TFLITE,
}


GENAI_CONFIG = "genai_config.json"
"""Marks a version directory as a generative model's (an ONNX Runtime GenAI folder)."""
GENAI_FORMAT = "genai"
"""The format of a fleet artifact that is a whole generative folder (config, decoder,
tokenizer): not a :class:`ModelFormat`, as no batch runtime reads it; the token loop does."""


def is_generative(model_dir: Path) -> bool:
    """Whether a model directory is a generative model's: a version of it holds
    :data:`GENAI_CONFIG`. Such a model is served by the token loop (``agent/generative``),
    not by the batcher."""
    try:
        return any((v / GENAI_CONFIG).is_file() for v in model_dir.iterdir() if v.is_dir())
    except OSError:
        return False


def format_of(path: Path) -> ModelFormat | None:
    """The format a file's suffix names, or None if it is not a model file."""
    return _SUFFIXES.get(path.suffix.lower())


def find_model_file(version_dir: Path) -> tuple[Path, ModelFormat]:
    """The one model file in a version directory, and its format.

    An OpenVINO IR is the ``.xml`` file; its ``.bin`` must sit beside it. Where several model
    files are present, the one named ``model.*`` wins; otherwise the choice is ambiguous and
    refused rather than guessed.
    """
    if not version_dir.is_dir():
        raise ModelFileError(f"{version_dir} is not a directory")
    found = sorted(
        (path, fmt) for path in version_dir.iterdir() if (fmt := format_of(path)) is not None
    )
    if len(found) > 1:
        found = [(p, f) for p, f in found if p.stem == "model"] or found
    if not found:
        raise ModelFileError(
            f"no model file in {version_dir} (expected one of {', '.join(sorted(_SUFFIXES))})"
        )
    if len(found) > 1:
        names = ", ".join(p.name for p, _ in found)
        raise ModelFileError(f"several model files in {version_dir} ({names}); name one 'model.*'")
    path, fmt = found[0]
    if fmt is ModelFormat.OPENVINO_IR and not path.with_suffix(".bin").is_file():
        raise ModelFileError(f"OpenVINO IR {path.name} has no weights file {path.stem}.bin")
    return path, fmt
