"""ONNX Runtime backend: providers from the placement; threads and caches from settings."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import tempfile
from collections.abc import Iterator, Mapping
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

log = logging.getLogger("edgefleet.runtimes")

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
        provider_options = [self._provider_options(p, placement) for p in providers]
        session = self._open_session(ort, model_file, providers, provider_options)
        fallback = cpu_fallback(providers, session.get_providers())
        if fallback is not None:
            raise DeviceUnavailableError(f"onnxruntime: {fallback}")
        unranked = _unranked_tensors(model_file, session)
        signature = ModelSignature(
            inputs=tuple(_spec(i, "input", unranked) for i in session.get_inputs()),
            outputs=tuple(_spec(o, "output", unranked) for o in session.get_outputs()),
        )
        self._session = session
        self._output_names = [o.name for o in session.get_outputs()]
        return signature

    def _open_session(
        self, ort: Any, model_file: Path, providers: list[str], provider_options: list[Any]
    ) -> Any:
        """A session from the cached optimised graph if there is a good one, else the file."""

        def create(path: Path, options: Any) -> Any:
            return ort.InferenceSession(
                str(path),
                sess_options=options,
                providers=providers,
                provider_options=provider_options,
            )

        options = self._session_options(ort)
        path, pending = self._cache_plan(ort, model_file, providers, options, reuse=True)
        if path != model_file:
            try:
                return create(path, options)
            except Exception as exc:
                # NOTE: an entry cut short by a power loss must not break the model for good;
                # the model file is loaded instead and the entry written again.
                log.warning(
                    "onnxruntime: cached graph %s cannot be loaded (%s); removing it and "
                    "loading %s",
                    path,
                    _message(exc),
                    model_file,
                )
                with contextlib.suppress(OSError):  # a read-only cache: the rewrite is skipped
                    path.unlink()
            options = self._session_options(ort)
            path, pending = self._cache_plan(ort, model_file, providers, options, reuse=False)
        session = None
        try:
            session = create(path, options)
        except Exception as exc:
            raise _translate_load_error(exc, model_file) from exc
        finally:
            if pending is not None:
                _publish(pending, ok=session is not None)
        return session

    def _session_options(self, ort: Any) -> Any:
        s = self.settings
        options = ort.SessionOptions()
        # NOTE: ONNX Runtime's own logger writes ANSI-coloured text lines to stderr, one per
        # failed run; the failure reaches the caller as an exception (translated at this
        # boundary, logged as one JSON line by the agent), so only fatal ones are let through
        options.log_severity_level = 4
        options.intra_op_num_threads = s.intra_op_threads
        options.inter_op_num_threads = s.inter_op_threads
        options.graph_optimization_level = getattr(
            ort.GraphOptimizationLevel, _OPT_LEVELS[s.graph_optimization_level]
        )
        # NOTE: spinning threads make latency lower but burn idle cores on small devices.
        spin = "1" if s.allow_spinning else "0"
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        options.add_session_config_entry("session.inter_op.allow_spinning", spin)
        # NOTE: ONNX Runtime's CPU arena keeps the largest size it ever grew to: after the
        # batch-size measurement ran 32 rows of cnn on two sessions, 811 MB against 99 without
        # it once the heap was trimmed (runtimes/hardware/heap.py), at the same speed per row
        # (its memory pattern still plans each run's buffers in one block).
        options.enable_cpu_mem_arena = False
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
        self, ort: Any, model_file: Path, providers: list[str], options: Any, *, reuse: bool
    ) -> tuple[Path, tuple[Path, Path] | None]:
        """The file to load, and (scratch, final) paths if this load writes the cache.

        Only CPU-only sessions are cached: ONNX Runtime documents that graphs optimised at
        the extended/all levels are tied to the hardware and providers they were built for,
        so the key names both; other providers keep their own caches (TensorRT engines).
        Models with external data are not cached: the saved graph would point at weights
        beside the cache entry, not beside the model, and the key would not cover them.
        A cache folder that cannot be written is skipped with a warning (a read-only root).
        """
        level = self.settings.graph_optimization_level
        cache = self.settings.cache_dir
        if cache is None or providers != [CPU_PROVIDER] or level == "disable":
            return model_file, None
        try:
            data = model_file.read_bytes()
        except OSError as exc:
            raise ModelFileError(f"cannot read {model_file}: {exc}") from exc
        if _has_external_data(data):
            return model_file, None
        digest = hashlib.sha256(data).hexdigest()[:24]
        cached = cache / "onnxruntime" / f"{digest}-{ort.__version__}-{level}-{_cpu_tag()}.onnx"
        if reuse and cached.is_file():
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            return cached, None
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            fd, scratch = tempfile.mkstemp(dir=cached.parent, suffix=".partial")
            os.close(fd)
        except OSError as exc:
            log.warning(
                "onnxruntime: cache folder %s cannot be written (%s); loading %s without caching",
                cached.parent,
                exc,
                model_file.name,
            )
            return model_file, None
        options.optimized_model_filepath = scratch
        # ONNX Runtime warns that the saved graph is hardware-specific; the key covers that
        # (the options' severity, set above, already keeps that warning out)
        return model_file, (Path(scratch), cached)

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # NOTE: ONNX Runtime's Python binding takes and gives string tensors as str; the
        # project's BYTES tensors are object arrays of bytes. Fixed-width numpy bytes (S) are
        # converted too: ONNX Runtime reads them as C strings, past each unterminated value.
        feed = {
            k: _bytes_to_strings(k, v) if v.dtype.kind in "OSU" else v for k, v in inputs.items()
        }
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


def cpu_fallback(requested: list[str], active: list[str]) -> str | None:
    """Why a session runs on CPU only although other providers were asked for, or None.

    ONNX Runtime drops a provider it cannot create (a CUDA or cuDNN version mismatch) with a
    log line and runs on the CPU provider; the placement would still say GPU. One of the
    requested non-CPU providers active is enough (TensorRT may fall back to CUDA).
    """
    wanted = [p for p in requested if p != CPU_PROVIDER]
    if not wanted or any(p in active for p in wanted):
        return None
    return (
        f"none of {wanted} could be started (ONNX Runtime's log says why); the session "
        f"would run on {active}"
    )


_LOCATION_KEY = b"\x0a\x08location"
"""How the key of a tensor's ``external_data`` entry ("location", field 1) is serialized. A
model without these bytes has no external data; one with them (or a node input of that name)
is parsed to tell."""


def _has_external_data(data: bytes) -> bool:
    if _LOCATION_KEY not in data:
        # NOTE: importing onnx to parse every cached model cost the agent about 7 MB of
        # resident memory (idle RSS with mlp 115 -> 122 MB in the footprint benchmark)
        return False
    import onnx

    try:
        model = onnx.ModelProto.FromString(data)
    except Exception:
        return False  # not a model: ONNX Runtime reports it when it loads the file
    return any(onnx.external_data_helper.uses_external_data(t) for t in _tensors(model.graph))


def _tensors(graph: Any) -> Iterator[Any]:
    """Every tensor stored in a graph: initializers and attributes, subgraphs included."""
    yield from graph.initializer
    yield from (s.values for s in graph.sparse_initializer)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sub in (*attr.graphs, *([attr.g] if attr.HasField("g") else [])):
                yield from _tensors(sub)


def _unranked_tensors(model_file: Path, session: Any) -> frozenset[str]:
    """Inputs and outputs the model declares no shape for (unknown rank).

    ONNX Runtime reports them with shape ``[]``, like a scalar; only the graph tells them apart.
    """
    args = [*session.get_inputs(), *session.get_outputs()]
    if not any(arg.shape == [] for arg in args):
        return frozenset()
    import onnx

    try:
        graph = onnx.load(str(model_file), load_external_data=False).graph
    except Exception:
        return frozenset()  # ONNX Runtime parsed it; keep its description
    return frozenset(
        vi.name
        for vi in (*graph.input, *graph.output)
        if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")
    )


def _spec(arg: Any, role: str, unranked: frozenset[str]) -> TensorSpec:
    try:
        datatype = from_onnx(arg.type)
    except KeyError:
        # sequences and maps (skl2onnx's ZipMap gives seq(map(int64,tensor(float))))
        raise UnsupportedModelError(
            f"onnxruntime: {role} {arg.name!r} has type {arg.type}; only tensors of the V2 "
            "datatypes are served"
        ) from None
    shape = tuple(d if isinstance(d, int) and d >= 0 else DYNAMIC for d in (arg.shape or ()))
    ranked = arg.name not in unranked
    return TensorSpec(name=arg.name, datatype=datatype, shape=shape, ranked=ranked)


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
    # NOTE: no input exists yet at load: InvalidArgument here is a file ONNX Runtime cannot
    # use (an empty one has "no graph"), not an invalid request.
    return ModelFileError(message)


def _publish(pending: tuple[Path, Path], *, ok: bool) -> None:
    scratch, final = pending
    try:
        if ok and scratch.stat().st_size > 0:
            scratch.replace(final)  # atomic: a later start never reads half a file
            return
    except OSError as exc:
        log.warning("onnxruntime: cannot write cache entry %s (%s)", final, exc)
    scratch.unlink(missing_ok=True)


def _cpu_tag() -> str:
    flags = ""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line for line in fh if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return platform.machine() + "-" + hashlib.sha256(flags.encode()).hexdigest()[:8]
