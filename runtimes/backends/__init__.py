"""The backends, by name. Each imports its native library only when a model is loaded."""

from __future__ import annotations

from pathlib import Path

from runtimes.backends.litert_backend import LiteRtBackend
from runtimes.backends.onnxruntime_backend import OnnxRuntimeBackend
from runtimes.backends.openvino_backend import OpenVinoBackend
from runtimes.base import Placement, Runtime, RuntimeName
from runtimes.settings import RuntimeSettings

BACKENDS: dict[RuntimeName, type[Runtime]] = {
    "onnxruntime": OnnxRuntimeBackend,
    "openvino": OpenVinoBackend,
    "litert": LiteRtBackend,
}


def open_model(
    model_file: Path, placement: Placement, settings: RuntimeSettings | None = None
) -> Runtime:
    """Create the placement's backend and load ``model_file`` into it."""
    runtime = BACKENDS[placement.runtime](settings)
    runtime.load(model_file, placement)
    return runtime
