"""ONNX Runtime backend: providers from the placement; threads and caches from settings."""

from __future__ import annotations

import hashlib
import os
import platform
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from runtimes.base import Placement, Runtime
from runtimes.datatypes import from_onnx
from runtimes.errors import (
    DeviceUnavailableError,
    InferenceFailedError,
    InvalidInputError,
    ModelFileError,
    RuntimeFailure,
    RuntimeNotInstalledError,
    UnsupportedModelError,
)
from runtimes.formats import ModelFormat
from runtimes.signature import DYNAMIC, ModelSignature, TensorSpec

CPU_PROVIDER = "CPUExecutionProvider"

_OPT_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise RuntimeNotInstalledError("onnxruntime is not installed") from exc
    return onnxruntime


class OnnxRuntimeBackend(Runtime):
    name = "onnxruntime"
    formats = frozenset({ModelFormat.ONNX})

    _session: Any = None
    _output_names: list[str]

    def _load(self, model_file: Path, placement: Placement) -> ModelSignature:
        ort = _ort()
        self._session = None
        available = ort.get_available_providers()
        wanted = [p for p in placement.providers if p != CPU_PROVIDER]
        providers = [p for p in wanted if p in available]
        if wanted and not providers:
            raise DeviceUnavailableError(
                f"onnxruntime: none of {wanted} is available in this build "
                f"(available: {', '.join(available)})"
            )
        providers.append(CPU_PROVIDER)
        options = self._session_options(ort)
        provider_options = [self._provider_options(p, placement) for p in providers]
        path, pending = self._cache_plan(ort, model_file, providers, options)
        try:
            self._session = ort.InferenceSession(
                str(path),
                sess_options=options,
                providers=providers,
                provider_options=provider_options,
            )
        except Exception as exc:
            raise _translate_load_error(exc, model_file) from exc
        finally:
            if pending is not None:
                _publish(pending, ok=self._session is not None)
        self._output_names = [o.name for o in self._session.get_outputs()]
        try:
            return ModelSignature(
                inputs=tuple(_spec(i, "input") for i in self._session.get_inputs()),
                outputs=tuple(_spec(o, "output") for o in self._session.get_outputs()),
            )
        except UnsupportedModelError:
            self._session = None
            raise

    def _session_options(self, ort: Any) -> Any:
        s = self.settings
        options = ort.SessionOptions()
        options.intra_op_num_threads = s.intra_op_threads
        options.inter_op_num_threads = s.inter_op_threads
        options.graph_optimization_level = getattr(
            ort.GraphOptimizationLevel, _OPT_LEVELS[s.graph_optimization_level]
        )
        # NOTE: spinning threads make latency lower but burn idle cores on small devices.
        spin = "1" if s.allow_spinning else "0"
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        options.add_session_config_entry("session.inter_op.allow_spinning", spin)
        return options

    def _provider_options(self, provider: str, placement: Placement) -> dict[str, str]:
        options = dict(placement.provider_options.get(provider, {}))
        cache = self.settings.cache_dir
        if cache is not None and provider == "TensorrtExecutionProvider":
            options.setdefault("trt_engine_cache_enable", "True")
            options.setdefault("trt_engine_cache_path", str(cache / "tensorrt"))
        if cache is not None and provider == "OpenVINOExecutionProvider":
            options.setdefault("cache_dir", str(cache / "openvino-ep"))
        return options

    def _cache_plan(
        self, ort: Any, model_file: Path, providers: list[str], options: Any
    ) -> tuple[Path, tuple[Path, Path] | None]:
        """The file to load, and (scratch, final) paths if this load writes the cache.

        Only CPU-only sessions are cached: ONNX Runtime documents that graphs optimised at
        the extended/all levels are tied to the hardware and providers they were built for,
        so the key names both; other providers keep their own caches (TensorRT engines).
        """
        level = self.settings.graph_optimization_level
        cache = self.settings.cache_dir
        if cache is None or providers != [CPU_PROVIDER] or level == "disable":
            return model_file, None
        try:
            digest = hashlib.sha256(model_file.read_bytes()).hexdigest()[:24]
        except OSError as exc:
            raise ModelFileError(f"cannot read {model_file}: {exc}") from exc
        cached = cache / "onnxruntime" / f"{digest}-{ort.__version__}-{level}-{_cpu_tag()}.onnx"
        if cached.is_file():
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            return cached, None
        cached.parent.mkdir(parents=True, exist_ok=True)
        fd, scratch = tempfile.mkstemp(dir=cached.parent, suffix=".partial")
        os.close(fd)
        options.optimized_model_filepath = scratch
        # ONNX Runtime warns that the saved graph is hardware-specific; the key covers that.
        options.log_severity_level = 3
        return model_file, (Path(scratch), cached)

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # NOTE: ONNX Runtime's Python binding takes and gives string tensors as str; the
        # project's BYTES tensors are object arrays of bytes.
        feed = {k: _bytes_to_strings(k, v) if v.dtype == object else v for k, v in inputs.items()}
        try:
            results = self._session.run(self._output_names, feed)
        except Exception as exc:
            raise InferenceFailedError(f"onnxruntime: {_message(exc)}") from exc
        return {
            name: _strings_to_bytes(r) if r.dtype == object else r
            for name, r in zip(self._output_names, results, strict=True)
        }

    def _close(self) -> None:
        self._session = None


def _bytes_to_strings(name: str, array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape, dtype=object)
    try:
        for index, value in np.ndenumerate(array):
            out[index] = value.decode() if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"input {name!r}: onnxruntime string tensors must be UTF-8 ({exc})", field=name
        ) from None
    return out


def _strings_to_bytes(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape, dtype=object)
    for index, value in np.ndenumerate(array):
        out[index] = value.encode() if isinstance(value, str) else value
    return out


def _spec(arg: Any, role: str) -> TensorSpec:
    try:
        datatype = from_onnx(arg.type)
    except KeyError:
        # sequences and maps (skl2onnx's ZipMap gives seq(map(int64,tensor(float))))
        raise UnsupportedModelError(
            f"onnxruntime: {role} {arg.name!r} has type {arg.type}; only tensors of the V2 "
            "datatypes are served"
        ) from None
    shape = tuple(d if isinstance(d, int) and d >= 0 else DYNAMIC for d in (arg.shape or ()))
    return TensorSpec(name=arg.name, datatype=datatype, shape=shape)


def _message(exc: Exception) -> str:
    text = str(exc)
    # "[ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model ... failed:..." -> the tail
    return text.split(" : ", 3)[-1].strip() if text.startswith("[ONNXRuntimeError]") else text


def _translate_load_error(exc: Exception, model_file: Path) -> RuntimeFailure:
    kind = type(exc).__name__
    message = f"onnxruntime cannot load {model_file.name}: {_message(exc)}"
    if kind in ("InvalidProtobuf", "NoSuchFile", "NoModel"):
        return ModelFileError(message)
    if kind == "NotImplemented" or "not a registered function/op" in str(exc):
        return UnsupportedModelError(message)
    if kind == "InvalidGraph":
        return ModelFileError(message)
    if kind == "EPFail":
        return DeviceUnavailableError(message)
    if kind == "InvalidArgument":
        return InvalidInputError(message)
    return ModelFileError(message)


def _publish(pending: tuple[Path, Path], *, ok: bool) -> None:
    scratch, final = pending
    if ok and scratch.stat().st_size > 0:
        scratch.replace(final)  # atomic: a later start never reads half a file
    else:
        scratch.unlink(missing_ok=True)


def _cpu_tag() -> str:
    flags = ""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line for line in fh if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return platform.machine() + "-" + hashlib.sha256(flags.encode()).hexdigest()[:8]
