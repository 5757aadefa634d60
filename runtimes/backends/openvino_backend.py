"""OpenVINO backend: NPU, GPU, CPU or AUTO; reads ONNX, IR (.xml + .bin) and TFLite."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Collection, Mapping
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

log = logging.getLogger("edgefleet.runtimes")

# Devices that choose among, or split a model across, the devices listed after the colon.
VIRTUAL_DEVICES = ("AUTO", "MULTI", "HETERO")
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
        missing = missing_devices(device, core.available_devices)
        if missing:
            raise DeviceUnavailableError(
                f"openvino: device {', '.join(missing)} not present "
                f"(OpenVINO reports {', '.join(core.available_devices) or 'none'})"
            )
        if self.settings.cache_dir is not None:
            # Compiling from a path with CACHE_DIR set lets a second start import the
            # compiled blob instead of reading and compiling the model again.
            cache = self.settings.cache_dir / "openvino"
            try:
                core.set_property({"CACHE_DIR": str(cache)})
            except RuntimeError as exc:
                # A cache is an optimisation: a read-only or misplaced one costs start-up
                # time, not the model.
                log.warning("openvino: not caching compiled models in %s: %s", cache, _message(exc))
        if not model_file.is_file():
            raise ModelFileError(f"openvino cannot load {model_file}: no such file")
        try:
            compiled = core.compile_model(str(model_file), device, self._config(device, placement))
        except RuntimeError as exc:
            raise _translate(exc, model_file) from exc
        inputs, outputs = _port_names(core, model_file, compiled)
        signature = ModelSignature(
            inputs=tuple(_spec(p, "input", n, model_file) for p, n in inputs),
            outputs=tuple(_spec(p, "output", n, model_file) for p, n in outputs),
        )
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self._lock = threading.Lock()
        self._outputs = outputs
        return signature

    def _config(self, device: str, placement: Placement) -> dict[str, Any]:
        s = self.settings
        config: dict[str, Any] = {"PERFORMANCE_HINT": s.openvino_performance_hint}
        cpu: dict[str, Any] = {}
        if s.openvino_cpu_precision is not None:
            cpu["INFERENCE_PRECISION_HINT"] = s.openvino_cpu_precision
        if s.intra_op_threads:
            cpu["INFERENCE_NUM_THREADS"] = s.intra_op_threads
            # A thread count set here means other compiled models share this process's
            # cores (the agent's instances of a model split them). Pinned, OpenVINO ran them all
            # on the same core: three instances of cnn served 120 rows/s on 1.0 of two
            # cores, 238 on 1.95 unpinned (2026-12-04, AMD EPYC, f32). The kernel places
            # them; a profile's options may still pin.
            cpu["ENABLE_CPU_PINNING"] = False
        if device == "CPU":
            config.update(cpu)
        elif cpu and _may_run_on_cpu(device):
            # AUTO, MULTI and HETERO pass per-device settings down: without them the CPU
            # under AUTO:NPU,CPU computed in bf16 (outputs off by 0.05 on a 64-wide MatMul).
            config["DEVICE_PROPERTIES"] = {"CPU": cpu}
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


def missing_devices(device: str, available: Collection[str]) -> list[str]:
    """The devices named in an OpenVINO device string that ``available`` (OpenVINO's
    ``available_devices``) lacks and the placement cannot do without; empty if it can run.

    ``AUTO`` and ``MULTI`` need one of their devices (``AUTO:NPU,CPU`` runs on a machine
    without an NPU), ``HETERO`` and a plain device need all. A device counts as present
    when OpenVINO lists it or numbers it (``GPU`` is present as ``GPU.0`` and ``GPU.1``)."""
    virtual, _, listed = device.partition(":")
    if virtual not in VIRTUAL_DEVICES:
        return [] if _present(device, available) else [device]
    # AUTO:GPU,-CPU excludes CPU; MULTI:GPU(4) gives GPU four requests.
    names = [d.split("(")[0].strip() for d in listed.split(",")]
    names = [d for d in names if d and not d.startswith("-")]
    missing = [d for d in names if not _present(d, available)]
    if virtual != "HETERO" and len(missing) < len(names):
        return []
    return missing


def _may_run_on_cpu(device: str) -> bool:
    """Whether a virtual device string may place work on the CPU (``AUTO`` alone may, and
    ``AUTO:GPU,-CPU`` may not)."""
    virtual, _, listed = device.partition(":")
    if virtual not in VIRTUAL_DEVICES:
        return False
    names = [d.split("(")[0].strip() for d in listed.split(",") if d.strip()]
    if "-CPU" in names:
        return False
    return not listed or "CPU" in names


def _present(device: str, available: Collection[str]) -> bool:
    base, _, index = device.partition(".")
    # OpenVINO lists one GPU as GPU and several as GPU.0, GPU.1; GPU.0 names the one too.
    return any(
        a == device or a.startswith(device + ".") or (index == "0" and a == base) for a in available
    )


_Ports = list[tuple[Any, str]]


def _port_names(core: Any, model_file: Path, compiled: Any) -> tuple[_Ports, _Ports]:
    """Each input and output port with its name as the model file declares it.

    A compiled port can carry several tensor names: where OpenVINO removed an ``Identity``,
    the graph output ``scores`` and the internal tensor ``a_hidden`` it copied are one port,
    and ``get_any_name()`` gives the alphabetically first. The model's own names are then
    read: the ONNX graph's (without its weights), or those of the model as OpenVINO reads
    it (IR, TFLite). Ports with one name, the usual case, cost nothing."""
    inputs, outputs = list(compiled.inputs), list(compiled.outputs)
    declared: tuple[list[str], list[str]] = ([], [])
    if any(len(p.get_names()) > 1 for p in inputs + outputs):
        declared = _declared_names(core, model_file)
    return (
        list(zip(inputs, _choose(inputs, declared[0]), strict=True)),
        list(zip(outputs, _choose(outputs, declared[1]), strict=True)),
    )


def _declared_names(core: Any, model_file: Path) -> tuple[list[str], list[str]]:
    if model_file.suffix == ".onnx":
        import onnx

        graph = onnx.load(str(model_file), load_external_data=False).graph
        weights = {t.name for t in graph.initializer}
        inputs = [i.name for i in graph.input if i.name not in weights]
        return inputs, [o.name for o in graph.output]
    model = core.read_model(str(model_file))
    return (
        [min(p.get_names(), default="") for p in model.inputs],
        [min(p.get_names(), default="") for p in model.outputs],
    )


def _choose(ports: list[Any], declared: list[str]) -> list[str]:
    chosen = []
    for i, port in enumerate(ports):
        names = port.get_names()
        # Ports keep the model's order; the search covers one that did not.
        if i < len(declared) and declared[i] in names:
            chosen.append(declared[i])
        else:
            # min(): with no declared name to go by, the same choice on every load.
            chosen.append(next((n for n in declared if n in names), min(names)))
    return chosen


def _spec(port: Any, role: str, name: str, model_file: Path) -> TensorSpec:
    shape = tuple(DYNAMIC if d.is_dynamic else d.get_length() for d in port.get_partial_shape())
    type_name = port.get_element_type().get_type_name()
    try:
        datatype = from_openvino(type_name)
    except KeyError:  # u4, f8e4m3, nf4...: no V2 datatype
        raise UnsupportedModelError(
            f"openvino: {role} {name!r} has element type {type_name}, which has no V2 datatype"
        ) from None
    if datatype == "BYTES":
        # NOTE: OpenVINO refuses the object arrays of bytes that BYTES tensors are decoded
        # into, and a process that ran one string inference aborts at exit
        # (munmap_chunk(): invalid pointer; openvino 2026.4). Refused at load, placement
        # can choose another runtime for the model.
        raise UnsupportedModelError(
            f"openvino cannot load {model_file.name}: {role} {name!r} holds strings (BYTES), "
            "which the openvino backend does not support"
        )
    return TensorSpec(name=name, datatype=datatype, shape=shape)


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
