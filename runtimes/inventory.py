"""Which runtimes are installed and what devices each reports.

This is the second seam of placement: on a device it asks the libraries themselves; tests of
hardware that cannot run here (an NPU, a GPU, an EdgeTPU) build a :class:`RuntimeInventory`
by hand.

Probing must not cost the agent memory it will not use: OpenVINO is only imported to ask for
its devices when an Intel GPU or NPU device node exists (without one its only device is CPU),
and LiteRT is found rather than imported. Each library is imported for real when a model is
placed on it.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

# OpenVINO's GPU plugin needs a DRM render node and its NPU plugin an accel node.
OPENVINO_DEVICE_NODES = ("dev/dri/renderD*", "dev/accel/accel*")


@dataclass(frozen=True)
class RuntimeInfo:
    name: str
    version: str | None
    devices: frozenset[str] = frozenset()
    """onnxruntime: execution providers; openvino: devices; litert: CPU."""
    missing_reason: str | None = None

    @property
    def installed(self) -> bool:
        return self.missing_reason is None


@dataclass(frozen=True)
class RuntimeInventory:
    runtimes: dict[str, RuntimeInfo]
    delegate_libraries: frozenset[str] = field(default_factory=frozenset)
    """LiteRT delegate libraries that load on this machine."""

    def get(self, name: str) -> RuntimeInfo:
        return self.runtimes.get(name) or RuntimeInfo(name, None, missing_reason="unknown runtime")


def probe_runtimes(delegates: Iterable[str] = (), root: Path | None = None) -> RuntimeInventory:
    """Ask each installed library what it can do; ``delegates`` are LiteRT libraries to try.

    With ``root`` (the hardware root), OpenVINO is asked only if that machine has a device
    node its GPU or NPU plugin could use."""
    return RuntimeInventory(
        runtimes={
            "onnxruntime": _probe_onnxruntime(),
            "openvino": _probe_openvino(root),
            "litert": _probe_litert(),
        },
        delegate_libraries=frozenset(d for d in set(delegates) if _library_loads(d)),
    )


def _probe_onnxruntime() -> RuntimeInfo:
    try:
        import onnxruntime
    except ImportError as exc:
        return RuntimeInfo("onnxruntime", None, missing_reason=f"not installed ({exc})")
    return RuntimeInfo(
        "onnxruntime", onnxruntime.__version__, frozenset(onnxruntime.get_available_providers())
    )


def _probe_openvino(root: Path | None) -> RuntimeInfo:
    if importlib.util.find_spec("openvino") is None:
        return RuntimeInfo("openvino", None, missing_reason="not installed")
    if root is not None and not any(
        glob.glob(str(root / pattern)) for pattern in OPENVINO_DEVICE_NODES
    ):
        return RuntimeInfo("openvino", _version("openvino"), frozenset({"CPU"}))
    try:
        import openvino
    except ImportError as exc:
        return RuntimeInfo("openvino", None, missing_reason=f"not installed ({exc})")
    version = openvino.get_version().split("-")[0]
    return RuntimeInfo("openvino", version, frozenset(openvino.Core().available_devices))


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def _probe_litert() -> RuntimeInfo:
    for dist, module in (
        ("ai-edge-litert", "ai_edge_litert"),
        ("tflite-runtime", "tflite_runtime"),
    ):
        try:
            found = importlib.util.find_spec(f"{module}.interpreter") is not None
        except ImportError:
            found = False
        if found:
            return RuntimeInfo("litert", f"{_version(dist)} ({dist})", frozenset({"CPU"}))
    return RuntimeInfo(
        "litert", None, missing_reason="neither ai-edge-litert nor tflite-runtime installed"
    )


def _library_loads(name: str) -> bool:
    """Whether ``name`` loads as LiteRT will load it: by the same name, so through the same
    search (a bare name is looked up by the dynamic loader), with all its dependencies."""
    # NOTE: a library that find_library() finds may still not load (a dependency missing),
    # and it may find another version than the one named; neither can be used.
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True
