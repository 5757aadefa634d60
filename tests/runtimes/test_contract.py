"""One contract suite, run against every backend with the same cases."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from runtimes.backends import BACKENDS, open_model
from runtimes.backends.openvino_backend import OpenVinoBackend
from runtimes.base import Placement
from runtimes.errors import (
    DeviceUnavailableError,
    InputDatatypeError,
    InputNameError,
    InputShapeError,
    ModelFileError,
    RuntimeFailure,
    UnsupportedModelError,
)
from runtimes.formats import find_model_file
from runtimes.golden import GOLDEN_FILE, GoldenSample
from runtimes.settings import RuntimeSettings


@dataclass(frozen=True)
class Case:
    runtime: str
    model: str
    batch_sizes: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.runtime}-{self.model}"

    def placement(self) -> Placement:
        providers = ("CPUExecutionProvider",) if self.runtime == "onnxruntime" else ()
        return Placement(runtime=self.runtime, device="CPU", providers=providers)  # type: ignore[arg-type]


MLP_BATCHES = tuple(range(1, 33))
CNN_BATCHES = (1, 2, 3, 8, 17, 32)  # the CNN costs 0.3 GMAC per row; a spread, not all 32
CASES = [
    Case("onnxruntime", "mlp", MLP_BATCHES),
    Case("openvino", "mlp", MLP_BATCHES),
    Case("litert", "mlp_tflite", MLP_BATCHES),
    Case("openvino", "mlp_tflite", MLP_BATCHES),
    Case("onnxruntime", "cnn", CNN_BATCHES),
    Case("openvino", "cnn", CNN_BATCHES),
    Case("openvino", "cnn_ir", CNN_BATCHES),
]


@pytest.fixture(scope="module", params=CASES, ids=str)
def case(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def loaded(case: Case, example_repo: Path):  # type: ignore[no-untyped-def]
    model_file, _ = find_model_file(example_repo / case.model / "1")
    runtime = open_model(model_file, case.placement())
    yield runtime, GoldenSample.load(model_file.parent / GOLDEN_FILE)
    runtime.close()


def test_signature_describes_the_model(case: Case, loaded) -> None:  # type: ignore[no-untyped-def]
    runtime, _ = loaded
    sig = runtime.signature
    assert [(t.name, t.datatype) for t in sig.inputs] == [("input", "FP32")]
    assert [(t.name, t.datatype) for t in sig.outputs] == [("logits", "FP32")]
    if case.model.startswith("mlp"):
        assert sig.inputs[0].shape == (-1, 256) and sig.outputs[0].shape == (-1, 10)
    else:
        assert sig.inputs[0].shape == (-1, 3, 224, 224) and sig.outputs[0].shape == (-1, 1000)
    assert sig.batched


def test_golden_output_matches_the_numpy_reference(loaded) -> None:  # type: ignore[no-untyped-def]
    runtime, golden = loaded
    assert golden.mismatches(runtime.infer(golden.inputs)) == []


@pytest.mark.slow
def test_every_batch_size_gives_each_row_its_own_answer(case: Case, loaded) -> None:  # type: ignore[no-untyped-def]
    runtime, golden = loaded
    x, expected = golden.inputs["input"], golden.outputs["logits"]
    for n in case.batch_sizes:
        rows = np.arange(n) % len(x)
        # Reversed order too: a backend that ignored row order would fail one of them.
        for order in (rows, rows[::-1]):
            out = runtime.infer({"input": x[order]})["logits"]
            assert out.shape == (n, expected.shape[1])
            np.testing.assert_allclose(out, expected[order], rtol=golden.rtol, atol=golden.atol)


def test_wrong_input_name_is_refused_naming_both(loaded) -> None:  # type: ignore[no-untyped-def]
    runtime, golden = loaded
    with pytest.raises(InputNameError, match=r"unknown input 'pixels'.*\['input'\]") as info:
        runtime.infer({"pixels": golden.inputs["input"]})
    assert info.value.field == "pixels" and info.value.code == "invalid_input_name"
    with pytest.raises(InputNameError, match="missing input 'input'"):
        runtime.infer({})


def test_wrong_datatype_is_refused(loaded) -> None:  # type: ignore[no-untyped-def]
    runtime, golden = loaded
    with pytest.raises(
        InputDatatypeError, match="'input' has datatype FP64, the model expects FP32"
    ):
        runtime.infer({"input": golden.inputs["input"].astype(np.float64)})


def test_wrong_shape_is_refused(loaded) -> None:  # type: ignore[no-untyped-def]
    runtime, golden = loaded
    x = golden.inputs["input"]
    with pytest.raises(
        InputShapeError, match=r"'input' has shape \[.*\], the model expects \[-1, "
    ):
        runtime.infer({"input": x[..., :-1]})
    with pytest.raises(InputShapeError, match="rank|shape"):
        runtime.infer({"input": x[0]})
    with pytest.raises(InputShapeError, match="empty batch"):
        runtime.infer({"input": x[:0]})


def test_closed_runtime_refuses_to_run(case: Case, example_repo: Path) -> None:
    model_file, _ = find_model_file(example_repo / case.model / "1")
    runtime = open_model(model_file, case.placement())
    golden = GoldenSample.load(model_file.parent / GOLDEN_FILE)
    runtime.close()
    with pytest.raises(RuntimeFailure, match="no model is loaded"):
        runtime.infer(golden.inputs)


def test_truncated_model_file_is_a_model_file_error(
    case: Case, example_repo: Path, tmp_path: Path
) -> None:
    model_file, _ = find_model_file(example_repo / case.model / "1")
    for sibling in model_file.parent.iterdir():
        shutil.copy(sibling, tmp_path / sibling.name)
    # For an IR the weights file is the one cut short: the XML still parses.
    victim = tmp_path / (
        model_file.stem + ".bin" if model_file.suffix == ".xml" else model_file.name
    )
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 3])
    with pytest.raises(ModelFileError) as info:
        open_model(tmp_path / model_file.name, case.placement())
    assert case.runtime in str(info.value) and model_file.name in str(info.value)
    assert info.value.code == "model_invalid"


def test_missing_model_file_is_a_model_file_error(case: Case, tmp_path: Path) -> None:
    suffix = {"onnxruntime": ".onnx", "openvino": ".onnx", "litert": ".tflite"}[case.runtime]
    with pytest.raises(ModelFileError):
        open_model(tmp_path / f"absent{suffix}", case.placement())


# -- the same model on several backends gives the same answer ---------------------------------


def _outputs_on(
    example_repo: Path, pairs: list[tuple[str, str]], x: np.ndarray
) -> list[np.ndarray]:
    outs = []
    for runtime_name, model in pairs:
        model_file, _ = find_model_file(example_repo / model / "1")
        providers = ("CPUExecutionProvider",) if runtime_name == "onnxruntime" else ()
        runtime = open_model(model_file, Placement(runtime=runtime_name, providers=providers))  # type: ignore[arg-type]
        outs.append(runtime.infer({"input": x})["logits"])
        runtime.close()
    return outs


def test_mlp_agrees_on_onnxruntime_openvino_and_litert(example_repo: Path) -> None:
    x = np.random.default_rng(1).standard_normal((13, 256)).astype(np.float32)
    ort, ov, tfl = _outputs_on(
        example_repo, [("onnxruntime", "mlp"), ("openvino", "mlp"), ("litert", "mlp_tflite")], x
    )
    np.testing.assert_allclose(ov, ort, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tfl, ort, rtol=1e-4, atol=1e-4)


def test_cnn_agrees_on_onnxruntime_and_openvino_onnx_and_ir(example_repo: Path) -> None:
    x = np.random.default_rng(2).uniform(-1, 1, (3, 3, 224, 224)).astype(np.float32)
    ort, ov_onnx, ov_ir = _outputs_on(
        example_repo, [("onnxruntime", "cnn"), ("openvino", "cnn"), ("openvino", "cnn_ir")], x
    )
    assert np.abs(ort).max() > 0.1  # a dead network would agree trivially
    np.testing.assert_allclose(ov_onnx, ort, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(ov_ir, ort, rtol=1e-3, atol=1e-3)


# -- errors translated at the boundary --------------------------------------------------------


def _custom_op_onnx(path: Path) -> Path:
    node = helper.make_node("FrobnicateXYZ", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("runtime_name", ["onnxruntime", "openvino"])
def test_unsupported_operator_is_reported_as_such(runtime_name: str, tmp_path: Path) -> None:
    path = _custom_op_onnx(tmp_path / "custom.onnx")
    placement = Placement(
        runtime=runtime_name,
        providers=("CPUExecutionProvider",) if runtime_name == "onnxruntime" else (),
    )  # type: ignore[arg-type]
    with pytest.raises(UnsupportedModelError, match="FrobnicateXYZ") as info:
        open_model(path, placement)
    assert info.value.code == "model_unsupported"


def test_unsupported_operator_in_tflite_is_reported_as_such(tmp_path: Path) -> None:
    from runtimes.examples.tflite_models import custom_op_tflite

    path = tmp_path / "custom.tflite"
    path.write_bytes(custom_op_tflite("FrobnicateXYZ"))
    with pytest.raises(UnsupportedModelError, match="FrobnicateXYZ"):
        open_model(path, Placement(runtime="litert"))


def test_absent_openvino_device_is_device_unavailable(example_repo: Path) -> None:
    import openvino

    if "NPU" in openvino.Core().available_devices:
        pytest.skip("this machine has a real NPU")
    with pytest.raises(DeviceUnavailableError, match="NPU not present"):
        open_model(example_repo / "mlp/1/model.onnx", Placement(runtime="openvino", device="NPU"))


def test_absent_execution_provider_is_device_unavailable(example_repo: Path) -> None:
    import onnxruntime

    if "QNNExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime build has QNN")
    placement = Placement(runtime="onnxruntime", device="NPU", providers=("QNNExecutionProvider",))
    with pytest.raises(DeviceUnavailableError, match="QNNExecutionProvider"):
        open_model(example_repo / "mlp/1/model.onnx", placement)


def test_absent_litert_delegate_is_device_unavailable(example_repo: Path) -> None:
    placement = Placement(runtime="litert", device="EdgeTPU", delegate="libedgetpu-absent.so.1")
    with pytest.raises(DeviceUnavailableError, match="libedgetpu-absent.so.1"):
        open_model(example_repo / "mlp_tflite/1/model.tflite", placement)


# -- compiled-model caches --------------------------------------------------------------------


def test_onnxruntime_cache_is_written_once_and_reused(example_repo: Path, tmp_path: Path) -> None:
    settings = RuntimeSettings(cache_dir=tmp_path)
    placement = Case("onnxruntime", "cnn", ()).placement()
    golden = GoldenSample.load(example_repo / "cnn/1" / GOLDEN_FILE)
    first = open_model(example_repo / "cnn/1/model.onnx", placement, settings)
    cached = list((tmp_path / "onnxruntime").iterdir())
    assert len(cached) == 1 and cached[0].suffix == ".onnx" and cached[0].stat().st_size > 0
    mtime = cached[0].stat().st_mtime_ns
    second = open_model(example_repo / "cnn/1/model.onnx", placement, settings)
    assert cached[0].stat().st_mtime_ns == mtime
    assert golden.mismatches(second.infer(golden.inputs)) == []
    assert golden.mismatches(first.infer(golden.inputs)) == []


def test_openvino_cache_dir_receives_the_compiled_blob(example_repo: Path, tmp_path: Path) -> None:
    settings = RuntimeSettings(cache_dir=tmp_path)
    golden = GoldenSample.load(example_repo / "cnn_ir/1" / GOLDEN_FILE)
    open_model(example_repo / "cnn_ir/1/model.xml", Placement(runtime="openvino"), settings).close()
    blobs = list((tmp_path / "openvino").glob("*.blob"))
    assert blobs, "OpenVINO wrote no compiled blob"
    again = open_model(example_repo / "cnn_ir/1/model.xml", Placement(runtime="openvino"), settings)
    assert golden.mismatches(again.infer(golden.inputs)) == []
    assert sorted((tmp_path / "openvino").glob("*.blob")) == sorted(blobs)


def test_backends_cover_every_runtime_name() -> None:
    assert set(BACKENDS) == {"onnxruntime", "openvino", "litert"}


def test_openvino_threads_split_between_models_are_not_pinned(example_repo: Path) -> None:
    """With fewer threads than cores (the agent's instances share them) OpenVINO must not pin:
    every compiled model's threads went to the same core. A profile's options still can."""
    model = example_repo / "cnn/1/model.onnx"
    golden = GoldenSample.load(example_repo / "cnn/1" / GOLDEN_FILE)
    split = RuntimeSettings(intra_op_threads=1)
    free = open_model(model, Placement(runtime="openvino"), split)
    pinned = open_model(
        model, Placement(runtime="openvino", options={"ENABLE_CPU_PINNING": True}), split
    )
    assert isinstance(free, OpenVinoBackend) and isinstance(pinned, OpenVinoBackend)
    try:
        assert free.compiled_property("ENABLE_CPU_PINNING") is False
        assert pinned.compiled_property("ENABLE_CPU_PINNING") is True
        assert free.compiled_property("INFERENCE_NUM_THREADS") == 1
        assert golden.mismatches(free.infer(golden.inputs)) == []
    finally:
        free.close()
        pinned.close()
