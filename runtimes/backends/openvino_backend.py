"""OpenVINO backend: NPU, GPU, CPU or AUTO; reads ONNX, IR (.xml + .bin) and TFLite."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from runtimes.base import Placement, Runtime
from runtimes.datatypes import from_openvino
from runtimes.errors import (
    DeviceUnavailableError,
    InferenceFailedError,
    ModelFileError,
    RuntimeFailure,
    RuntimeNotInstalledError,
    UnsupportedModelError,
)
from runtimes.formats import ModelFormat
from runtimes.signature import DYNAMIC, ModelSignature, TensorSpec

_UNSUPPORTED = ("No conversion rule", "OpConversionFailure", "not supported", "Unsupported")


def _ov() -> Any:
    try:
        import openvino
    except ImportError as exc:
        raise RuntimeNotInstalledError(
            "openvino is not installed (pip install 'edgefleet[openvino]')"
        ) from exc
    return openvino


class OpenVinoBackend(Runtime):
    name = "openvino"
    formats = frozenset({ModelFormat.ONNX, ModelFormat.OPENVINO_IR, ModelFormat.TFLITE})

    _compiled: Any = None
    _request: Any = None

    def _load(self, model_file: Path, placement: Placement) -> ModelSignature:
        ov = _ov()
        core = ov.Core()
        device = placement.device
        # AUTO, HETERO and MULTI are virtual devices that pick among the real ones.
        real = [d for d in re.split(r"[:,]", device) if d not in ("AUTO", "HETERO", "MULTI")]
        missing = [d for d in real if d.split(".")[0] not in core.available_devices]
        if missing:
            raise DeviceUnavailableError(
                f"openvino: device {', '.join(missing)} not present "
                f"(OpenVINO reports {', '.join(core.available_devices) or 'none'})"
            )
        if self.settings.cache_dir is not None:
            # Compiling from a path with CACHE_DIR set lets a second start import the
            # compiled blob instead of reading and compiling the model again.
            core.set_property({"CACHE_DIR": str(self.settings.cache_dir / "openvino")})
        if not model_file.is_file():
            raise ModelFileError(f"openvino cannot load {model_file}: no such file")
        try:
            self._compiled = core.compile_model(
                str(model_file), device, self._config(device, placement)
            )
        except RuntimeError as exc:
            raise _translate(exc, model_file) from exc
        self._request = self._compiled.create_infer_request()
        self._lock = threading.Lock()
        self._outputs = [(port, port.get_any_name()) for port in self._compiled.outputs]
        return ModelSignature(
            inputs=tuple(_spec(p, "input") for p in self._compiled.inputs),
            outputs=tuple(_spec(p, "output") for p in self._compiled.outputs),
        )

    def _config(self, device: str, placement: Placement) -> dict[str, Any]:
        s = self.settings
        config: dict[str, Any] = {"PERFORMANCE_HINT": s.openvino_performance_hint}
        if device == "CPU":
            if s.openvino_cpu_precision is not None:
                config["INFERENCE_PRECISION_HINT"] = s.openvino_cpu_precision
            if s.intra_op_threads:
                config["INFERENCE_NUM_THREADS"] = s.intra_op_threads
                # A thread count set here means other compiled models share this process's
                # cores (the agent's instances of a model split them). Pinned, OpenVINO ran them all
                # on the same core: three instances of cnn served 120 rows/s on 1.0 of two
                # cores, 238 on 1.95 unpinned (2026-12-04, AMD EPYC, f32). The kernel places
                # them; a profile's options may still pin.
                config["ENABLE_CPU_PINNING"] = False
        config.update(placement.options)
        return config

    def compiled_property(self, name: str) -> Any:
        """What OpenVINO settled on for the loaded model (``ENABLE_CPU_PINNING``,
        ``INFERENCE_NUM_THREADS``, ``NUM_STREAMS``, ``INFERENCE_PRECISION_HINT``...), which
        may differ from what was asked."""
        if self._compiled is None:
            raise RuntimeError("openvino: no model loaded")
        return self._compiled.get_property(name)

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            with self._lock:  # an InferRequest runs one inference at a time
                result = self._request.infer(dict(inputs), share_inputs=True)
                return {name: np.asarray(result[port]) for port, name in self._outputs}
        except RuntimeError as exc:
            raise InferenceFailedError(f"openvino: {_message(exc)}") from exc

    def _close(self) -> None:
        self._request = None
        self._compiled = None


def _spec(port: Any, role: str) -> TensorSpec:
    shape = tuple(DYNAMIC if d.is_dynamic else d.get_length() for d in port.get_partial_shape())
    type_name = port.get_element_type().get_type_name()
    try:
        datatype = from_openvino(type_name)
    except KeyError:  # u4, f8e4m3, nf4...: no V2 datatype
        raise UnsupportedModelError(
            f"openvino: {role} {port.get_any_name()!r} has element type {type_name}, which "
            "has no V2 datatype"
        ) from None
    return TensorSpec(name=port.get_any_name(), datatype=datatype, shape=shape)


def _message(exc: Exception) -> str:
    """OpenVINO prefixes messages with source locations and failed checks; drop them."""
    text = re.sub(r"Exception from \S+:\d+:\s*", "", str(exc))
    text = re.sub(r"Check '.*?' failed at \S+:\d+:\s*", "", text)
    return " ".join(text.split())


def _translate(exc: Exception, model_file: Path) -> RuntimeFailure:
    message = f"openvino cannot load {model_file.name}: {_message(exc)}"
    if any(marker in str(exc) for marker in _UNSUPPORTED):
        return UnsupportedModelError(message)
    return ModelFileError(message)
