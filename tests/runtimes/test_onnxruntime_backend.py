"""ONNX Runtime backend: the optimised-graph cache, providers, string tensors, declared shapes."""

from __future__ import annotations

import logging
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtimes.backends import open_model
from runtimes.backends.onnxruntime_backend import CPU_PROVIDER, cpu_fallback
from runtimes.base import Placement
from runtimes.errors import InputShapeError, InvalidInputError, ModelFileError
from runtimes.hardware.heap import limit_heaps, trim_heap
from runtimes.settings import RuntimeSettings

CPU = Placement(runtime="onnxruntime", providers=(CPU_PROVIDER,))
LOGGER = "edgefleet.runtimes"


def _save(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    path: Path,
    initializer: list[onnx.TensorProto] | None = None,
    **save_options: Any,
) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path, **save_options)
    return path


def _matmul(path: Path, weight: float, *, external: bool) -> Path:
    """y = x @ W with W a 64x64 matrix of ``weight``, inside the file or beside it."""
    w = numpy_helper.from_array(np.full((64, 64), weight, np.float32), "w")
    kw = {"save_as_external_data": True, "location": "model.onnx.data", "size_threshold": 0}
    return _save(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
        path,
        initializer=[w],
        **(kw if external else {}),
    )


def _first(model: Path, settings: RuntimeSettings) -> float:
    """y[0, 0] of a fresh load: 64 times the model's weight."""
    runtime = open_model(model, CPU, settings)
    try:
        return float(runtime.infer({"x": np.ones((1, 64), np.float32)})["y"][0, 0])
    finally:
        runtime.close()


def _cache_entries(cache_dir: Path) -> list[Path]:
    folder = cache_dir / "onnxruntime"
    return sorted(folder.iterdir()) if folder.is_dir() else []


# -- the optimised-graph cache ----------------------------------------------------------------


def test_model_with_external_data_starts_again_from_a_warm_cache(tmp_path: Path) -> None:
    model = _matmul(tmp_path / "m/1/model.onnx", 1.0, external=True)
    settings = RuntimeSettings(cache_dir=tmp_path / "cache")
    assert _first(model, settings) == 64.0
    # The second start failed: the cached graph pointed at model.onnx.data in the cache.
    assert _first(model, settings) == 64.0


def test_versions_differing_only_in_external_data_keep_their_own_weights(tmp_path: Path) -> None:
    v1 = _matmul(tmp_path / "m/1/model.onnx", 1.0, external=True)
    v2 = _matmul(tmp_path / "m/2/model.onnx", 2.0, external=True)
    assert v1.read_bytes() == v2.read_bytes()  # only model.onnx.data differs
    settings = RuntimeSettings(cache_dir=tmp_path / "cache")
    assert _first(v1, settings) == 64.0
    assert _first(v2, settings) == 128.0


def test_caching_a_model_without_external_data_does_not_import_onnx(tmp_path: Path) -> None:
    """Parsing every model with onnx to look for external data cost the agent about 7 MB of
    resident memory at idle; only a model holding the external-data key is parsed."""
    model = _matmul(tmp_path / "m/1/model.onnx", 1.0, external=False)
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from runtimes.backends import open_model\n"
        "from runtimes.base import Placement\n"
        "from runtimes.settings import RuntimeSettings\n"
        f"settings = RuntimeSettings(cache_dir=Path({str(tmp_path / 'cache')!r}))\n"
        "placement = Placement(runtime='onnxruntime', device='CPU',\n"
        "                      providers=('CPUExecutionProvider',))\n"
        "for _ in range(2):  # writes the cache, then reads it\n"
        f"    open_model(Path({str(model)!r}), placement, settings).close()\n"
        "print('onnx' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False", out.stderr
    assert _cache_entries(tmp_path / "cache")


def test_truncated_cache_entry_is_replaced_and_the_model_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = _matmul(tmp_path / "m/1/model.onnx", 1.0, external=False)
    settings = RuntimeSettings(cache_dir=tmp_path / "cache")
    assert _first(model, settings) == 64.0
    [entry] = _cache_entries(tmp_path / "cache")
    whole = entry.read_bytes()
    entry.write_bytes(whole[: len(whole) // 2])  # a power loss, as the filesystem left it
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _first(model, settings) == 64.0
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert str(entry) in caplog.records[0].getMessage()
    assert _cache_entries(tmp_path / "cache") == [entry] and entry.read_bytes() == whole
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _first(model, settings) == 64.0
    assert caplog.records == []


def test_unwritable_cache_dir_loads_without_caching(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = _matmul(tmp_path / "m/1/model.onnx", 1.0, external=False)
    (tmp_path / "file").write_text("")
    # Tests run as root, which chmod cannot stop; a folder under a file fails mkdir as a
    # read-only root would (NotADirectoryError is an OSError like EROFS).
    settings = RuntimeSettings(cache_dir=tmp_path / "file" / "cache")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _first(model, settings) == 64.0
    [record] = caplog.records
    assert "cannot be written" in record.getMessage()
    assert str(tmp_path / "file" / "cache") in record.getMessage()


# -- providers --------------------------------------------------------------------------------


def test_requested_gpu_running_on_cpu_is_refused_gpu_fallback_seam() -> None:
    """ONNX Runtime drops a GPU provider it cannot create (a CUDA or cuDNN mismatch) and runs
    on CPU; the CPU build has no provider that fails that way, so the comparison is checked
    on the lists `InferenceSession.get_providers()` gives in each case."""
    requested = ["TensorrtExecutionProvider", "CUDAExecutionProvider", CPU_PROVIDER]
    reason = cpu_fallback(requested, [CPU_PROVIDER])
    assert reason is not None
    assert "['TensorrtExecutionProvider', 'CUDAExecutionProvider']" in reason
    assert "['CPUExecutionProvider']" in reason
    # TensorRT missing but CUDA up is a GPU still; CPU alone was what was asked.
    assert cpu_fallback(requested, ["CUDAExecutionProvider", CPU_PROVIDER]) is None
    assert cpu_fallback([CPU_PROVIDER], [CPU_PROVIDER]) is None


def test_provider_the_session_really_starts_passes_the_check(tmp_path: Path) -> None:
    if "AzureExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime build has no AzureExecutionProvider")
    model = _matmul(tmp_path / "model.onnx", 1.0, external=False)
    placement = Placement(runtime="onnxruntime", providers=("AzureExecutionProvider",))
    runtime = open_model(model, placement)
    assert runtime.infer({"x": np.ones((2, 64), np.float32)})["y"][1, 0] == 64.0


# -- string tensors ---------------------------------------------------------------------------


def _strings(path: Path) -> Path:
    return _save(
        [helper.make_node("Identity", ["s"], ["o"])],
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["N", 2])],
        [helper.make_tensor_value_info("o", TensorProto.STRING, ["N", 2])],
        path,
    )


def test_numpy_bytes_and_unicode_arrays_reach_onnxruntime_as_strings(tmp_path: Path) -> None:
    runtime = open_model(_strings(tmp_path / "strings.onnx"), CPU)
    # Values as wide as the dtype have no terminating NUL: ONNX Runtime read on into the next
    # value and beyond the array ("abcdef..." for the first).
    full = [[b"ab", b"cd"], [b"ef", "é".encode()]]
    for array in (
        np.array(full, dtype=object),
        np.array(full),  # dtype S2
        np.array([["ab", "cd"], ["ef", "é"]]),  # dtype U2
    ):
        out = runtime.infer({"s": array})["o"]
        assert out.dtype == object and out.tolist() == full, array.dtype


def test_non_utf8_numpy_bytes_are_an_invalid_input(tmp_path: Path) -> None:
    runtime = open_model(_strings(tmp_path / "strings.onnx"), CPU)
    with pytest.raises(InvalidInputError, match="UTF-8") as info:
        runtime.infer({"s": np.array([[b"\xff\xfe", b"ok"]])})
    assert info.value.field == "s"


# -- declared shapes --------------------------------------------------------------------------


def _relu(path: Path, shape: list[int] | None) -> Path:
    return _save(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        path,
    )


def test_input_without_a_declared_shape_takes_any_rank(tmp_path: Path) -> None:
    runtime = open_model(_relu(tmp_path / "noshape.onnx", None), CPU)
    [spec] = runtime.signature.inputs
    assert spec.ranked is False and not runtime.signature.outputs[0].ranked
    for shape in ((), (3,), (2, 3), (1, 2, 2)):
        x = np.full(shape, -1.0, np.float32)
        np.testing.assert_array_equal(runtime.infer({"x": x})["y"], np.zeros(shape, np.float32))


def test_declared_scalar_input_still_refuses_other_ranks(tmp_path: Path) -> None:
    runtime = open_model(_relu(tmp_path / "scalar.onnx", []), CPU)
    [spec] = runtime.signature.inputs
    assert spec.ranked and spec.shape == ()
    assert runtime.infer({"x": np.array(2.0, np.float32)})["y"] == 2.0
    with pytest.raises(InputShapeError, match=r"has shape \[2\], the model expects \[\]"):
        runtime.infer({"x": np.ones(2, np.float32)})


# -- load errors ------------------------------------------------------------------------------


def test_empty_onnx_file_is_a_model_file_error(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"")
    with pytest.raises(ModelFileError, match="model.onnx") as info:
        open_model(tmp_path / "model.onnx", CPU)
    assert info.value.code == "model_invalid"


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_sessions_without_the_arena_answer_as_onnxruntime_does(
    example_repo: Path, model: str
) -> None:
    """The backend's sessions run without ONNX Runtime's CPU arena (which kept its largest
    size for good) and the heap is trimmed after a large batch: the outputs are ONNX Runtime's
    own, with its defaults, before and after."""
    model_file = example_repo / model / "1" / "model.onnx"
    runtime = open_model(model_file, CPU, RuntimeSettings(intra_op_threads=1))
    reference = onnxruntime.InferenceSession(str(model_file), providers=[CPU_PROVIDER])
    name = reference.get_inputs()[0].name
    row_shape = [d if isinstance(d, int) else 1 for d in reference.get_inputs()[0].shape[1:]]
    rng = np.random.default_rng(3)
    try:
        for rows in (1, 8, 1):
            x = rng.standard_normal((rows, *row_shape)).astype(np.float32)
            (expected,) = reference.run(None, {name: x})
            (got,) = runtime.infer({name: x}).values()
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
            if rows > 1:
                trim_heap()
    finally:
        runtime.close()


def test_the_heap_is_limited_and_trimmed_where_the_c_library_is_glibc() -> None:
    expected = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"
    assert limit_heaps() is expected and trim_heap() is expected
