"""LiteRT (TFLite) backend: XNNPACK on CPU, GPU and EdgeTPU delegates, dynamic batch by resize."""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from runtimes.base import Placement, Runtime
from runtimes.datatypes import from_numpy
from runtimes.errors import (
    DeviceUnavailableError,
    InferenceFailedError,
    ModelFileError,
    RuntimeFailure,
    RuntimeNotInstalledError,
    UnsupportedModelError,
)
from runtimes.formats import ModelFormat
from runtimes.native_output import logged_stderr
from runtimes.signature import ModelSignature, TensorSpec

log = logging.getLogger("edgefleet.runtimes.litert")

# Functions every LiteRT delegate plugin library exports (the external delegate ABI).
_DELEGATE_ENTRY_POINTS = ("tflite_plugin_create_delegate", "tflite_plugin_destroy_delegate")
# Placement options that configure this backend rather than the delegate.
_BACKEND_OPTIONS = frozenset({"xnnpack"})


def interpreter_module() -> Any:
    """``ai_edge_litert.interpreter``, or ``tflite_runtime.interpreter`` on older devices."""
    try:
        from ai_edge_litert import interpreter
    except ImportError:
        try:
            from tflite_runtime import interpreter
        except ImportError as exc:
            raise RuntimeNotInstalledError(
                "neither ai-edge-litert nor tflite-runtime is installed"
            ) from exc
    return interpreter


class LiteRtBackend(Runtime):
    name = "litert"
    formats = frozenset({ModelFormat.TFLITE})

    _interpreter: Any = None

    def _load(self, model_file: Path, placement: Placement) -> ModelSignature:
        module = interpreter_module()
        delegates = []
        if placement.delegate:
            delegates.append(_load_delegate(module, placement.delegate, placement))
        kwargs: dict[str, Any] = {"experimental_delegates": delegates or None}
        if self.settings.intra_op_threads:
            kwargs["num_threads"] = self.settings.intra_op_threads
        if placement.options.get("xnnpack") is False and not delegates:
            kwargs["experimental_op_resolver_type"] = (
                module.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
            )
        if not model_file.is_file():
            raise ModelFileError(f"litert cannot load {model_file}: no such file")
        try:
            with logged_stderr(log, "litert"):  # its delegate's INFO line, as a record
                self._interpreter = module.Interpreter(model_path=str(model_file), **kwargs)
                self._interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as exc:
            raise _translate(exc, model_file) from exc
        self._lock = threading.Lock()
        self._inputs = {d["name"]: d["index"] for d in self._interpreter.get_input_details()}
        self._outputs = {d["name"]: d["index"] for d in self._interpreter.get_output_details()}
        return ModelSignature(
            inputs=tuple(_spec(d, "input") for d in self._interpreter.get_input_details()),
            outputs=tuple(_spec(d, "output") for d in self._interpreter.get_output_details()),
        )

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        interp = self._interpreter
        try:
            with self._lock:  # the interpreter holds one set of tensors
                resized = False
                for detail in interp.get_input_details():
                    array = inputs[detail["name"]]
                    if tuple(detail["shape"]) != array.shape:
                        # strict: only dimensions that are -1 in shape_signature may change
                        interp.resize_tensor_input(detail["index"], array.shape, strict=True)
                        resized = True
                if resized:
                    interp.allocate_tensors()
                for name, index in self._inputs.items():
                    interp.set_tensor(index, np.ascontiguousarray(inputs[name]))
                interp.invoke()
                return {name: interp.get_tensor(index) for name, index in self._outputs.items()}
        except (ValueError, RuntimeError) as exc:
            raise InferenceFailedError(f"litert: {exc}") from exc

    def _close(self) -> None:
        self._interpreter = None


def _load_delegate(module: Any, library: str, placement: Placement) -> Any:
    failure = f"litert {placement.device}: cannot load delegate {library}"
    # NOTE: LiteRT's Delegate.__del__ raises on an object whose library failed to load or
    # lacks the plugin entry points, so the library is opened and checked here first and
    # LiteRT only sees good ones.
    try:
        handle = ctypes.CDLL(library)
    except OSError as exc:
        raise DeviceUnavailableError(f"{failure}: {exc}") from exc
    absent = [symbol for symbol in _DELEGATE_ENTRY_POINTS if not hasattr(handle, symbol)]
    if absent:
        raise DeviceUnavailableError(f"{failure}: not a LiteRT delegate (no {', '.join(absent)})")
    # This backend's own keys are not the delegate's; a delegate may refuse unknown ones.
    options = {k: v for k, v in placement.options.items() if k not in _BACKEND_OPTIONS}
    try:
        return module.load_delegate(library, options)
    except Exception as exc:  # ValueError from LiteRT, and whatever ctypes lets through
        raise DeviceUnavailableError(f"{failure}: {exc}") from exc


def _spec(detail: dict[str, Any], role: str) -> TensorSpec:
    signature = detail.get("shape_signature")
    shape = signature if signature is not None and len(signature) else detail["shape"]
    try:
        datatype = from_numpy(np.dtype(detail["dtype"]))
    except KeyError:  # complex64, for one
        raise UnsupportedModelError(
            f"litert: {role} {detail['name']!r} has type {np.dtype(detail['dtype'])}, which "
            "has no V2 datatype"
        ) from None
    return TensorSpec(name=detail["name"], datatype=datatype, shape=tuple(int(d) for d in shape))


def _translate(exc: Exception, model_file: Path) -> RuntimeFailure:
    message = f"litert cannot load {model_file.name}: {exc}"
    text = str(exc)
    if "unresolved custom op" in text or "Didn't find op" in text or "not supported" in text:
        return UnsupportedModelError(message)
    return ModelFileError(message)
