"""The one interface every backend implements, and where a model is placed.

A runtime is deliberately synchronous: the backends are blocking native calls, and the agent
runs each instance on an executor thread of its own. One instance runs one batch at a time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from runtimes.errors import InferenceFailedError, RuntimeFailure
from runtimes.formats import ModelFormat
from runtimes.settings import RuntimeSettings
from runtimes.signature import ModelSignature

RuntimeName = Literal["onnxruntime", "openvino", "litert"]


class Placement(BaseModel):
    """Which runtime runs a model, on which device, with which options."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime: RuntimeName
    device: str = "CPU"
    """CPU, GPU, NPU, EdgeTPU, DSP... For OpenVINO, its device name (``AUTO:NPU,CPU`` too)."""
    providers: tuple[str, ...] = ()
    """ONNX Runtime execution providers in order of preference (CPU is always appended)."""
    provider_options: dict[str, dict[str, str]] = Field(default_factory=dict)
    """ONNX Runtime options per execution provider."""
    delegate: str | None = None
    """LiteRT delegate library to load (None: the built-in XNNPACK CPU kernels)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Backend properties: OpenVINO config keys, LiteRT delegate options."""

    def describe(self) -> str:
        via = f" via {', '.join(self.providers)}" if self.providers else ""
        via += f" via {self.delegate}" if self.delegate else ""
        return f"{self.runtime} {self.device}{via}"


class Runtime(ABC):
    """Load one model file, describe it, run batches on it, close it."""

    name: ClassVar[RuntimeName]
    formats: ClassVar[frozenset[ModelFormat]]

    def __init__(self, settings: RuntimeSettings | None = None) -> None:
        self.settings = settings or RuntimeSettings()
        self._signature: ModelSignature | None = None

    @property
    def signature(self) -> ModelSignature:
        if self._signature is None:
            raise RuntimeFailure(f"{self.name}: no model is loaded")
        return self._signature

    def load(self, model_file: Path, placement: Placement) -> ModelSignature:
        """Load and compile the model for the placement's device; return its signature."""
        self._signature = self._load(model_file, placement)
        return self._signature

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model once. Inputs are validated first, so every backend rejects the same
        mistakes with the same :class:`~runtimes.errors.InvalidInputError`. The outputs are the
        model's as they are: whoever splits them by rows checks them first
        (:func:`check_rows`), since a dynamic first dimension is not always the batch."""
        self.signature.validate_inputs(inputs)
        return self._run(inputs)

    @abstractmethod
    def _load(self, model_file: Path, placement: Placement) -> ModelSignature: ...

    @abstractmethod
    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None:
        """Release the session; later calls to :meth:`infer` raise :class:`RuntimeFailure`."""
        self._signature = None
        self._close()

    @abstractmethod
    def _close(self) -> None: ...


def check_rows(name: str, outputs: Mapping[str, np.ndarray], rows: int) -> None:
    """Refuse outputs that do not have ``rows`` rows each: split across the requests of a
    batch, they would go to the wrong ones (pytriton's ``@batch`` checks the same). A model
    whose first output dimension is dynamic but not the batch (NonZero's ``[K, 2]``) fails it.

    Raises:
        InferenceFailedError: naming the first output whose row count differs.
    """
    for output, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != rows:
            raise InferenceFailedError(
                f"{name}: output {output!r} has shape {list(array.shape)}, expected {rows} rows"
            )
