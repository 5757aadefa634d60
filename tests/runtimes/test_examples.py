"""The example models: deterministic, the promised architectures, real files of each format."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest

from runtimes.examples import EXAMPLE_MODELS, write_example_repository
from runtimes.examples.weights import cnn_multiply_adds
from runtimes.formats import ModelFormat, find_model_file
from runtimes.golden import GOLDEN_FILE, GoldenSample


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_repository_layout_and_formats(example_repo: Path) -> None:
    expected = {
        "mlp": ModelFormat.ONNX,
        "cnn": ModelFormat.ONNX,
        "cnn_ir": ModelFormat.OPENVINO_IR,
        "mlp_tflite": ModelFormat.TFLITE,
    }
    assert set(EXAMPLE_MODELS) == set(expected) | {"classifier", "digits", "tiny-lm"}
    for name, fmt in expected.items():
        model_file, found = find_model_file(example_repo / name / "1")
        assert found is fmt
        assert (example_repo / name / "config.toml").is_file()
        golden = GoldenSample.load(model_file.parent / GOLDEN_FILE)
        assert set(golden.inputs) == {"input"} and set(golden.outputs) == {"logits"}
    assert (example_repo / "cnn_ir/1/model.bin").stat().st_size > 10_000_000
    assert not list(example_repo.glob(".*")), "scratch directories were left behind"


def test_writing_twice_gives_identical_bytes(example_repo: Path, tmp_path: Path) -> None:
    write_example_repository(
        tmp_path, models=("mlp", "mlp_tflite", "cnn", "classifier", "digits", "tiny-lm")
    )
    first = {k: v for k, v in _digests(example_repo).items() if not k.startswith("cnn_ir")}
    assert _digests(tmp_path) == first


def test_refuses_to_overwrite_without_being_asked(example_repo: Path) -> None:
    with pytest.raises(FileExistsError, match="mlp exists"):
        write_example_repository(example_repo, models=("mlp",))
    with pytest.raises(ValueError, match="unknown example models"):
        write_example_repository(example_repo, models=("resnet",))


def test_mlp_is_gemm_relu_256_1024_1024_10(example_repo: Path) -> None:
    model = onnx.load(example_repo / "mlp/1/model.onnx")
    assert [n.op_type for n in model.graph.node] == ["Gemm", "Relu", "Gemm", "Relu", "Gemm"]
    weights = {i.name: tuple(i.dims) for i in model.graph.initializer}
    assert [weights[f"fc{i}.weight"] for i in range(3)] == [(1024, 256), (1024, 1024), (10, 1024)]


def test_cnn_is_mobilenet_v2_sized(example_repo: Path) -> None:
    model = onnx.load(example_repo / "cnn/1/model.onnx")
    ops = [n.op_type for n in model.graph.node]
    depthwise = [
        n
        for n in model.graph.node
        if n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)
    ]
    assert len(depthwise) == 17  # one per inverted residual block
    assert ops.count("Add") == 10  # the residual connections of MobileNetV2
    # MobileNetV2 1.0 at 224x224 is about 300 million multiply-adds.
    assert 280e6 < cnn_multiply_adds() < 320e6


def test_tflite_file_is_a_real_flatbuffer(example_repo: Path) -> None:
    from ai_edge_litert import schema_py_generated as schema

    data = (example_repo / "mlp_tflite/1/model.tflite").read_bytes()
    assert data[4:8] == b"TFL3"
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAs(data, 0))
    codes = {c.builtinCode for c in model.operatorCodes}
    assert codes == {schema.BuiltinOperator.FULLY_CONNECTED}
    assert len(model.subgraphs[0].operators) == 3


def test_golden_outputs_are_not_degenerate(example_repo: Path) -> None:
    for name in ("mlp", "cnn"):
        golden = GoldenSample.load(example_repo / name / "1" / GOLDEN_FILE)
        out = golden.outputs["logits"]
        assert np.isfinite(out).all()
        assert out.std() > 0.05, f"{name}: outputs barely vary, a broken net would pass"
        # rows must differ far beyond the tolerance, or a row mix-up would go unnoticed
        assert np.abs(out[0] - out[1]).max() > 100 * golden.atol


def test_start_benchmark_measures_cold_and_warm_in_fresh_processes(example_repo: Path) -> None:
    from benchmarks.startup import measure

    (row,) = measure(example_repo, 1, (("openvino", "cnn_ir", "model.xml"),))
    for key in ("load_s", "process_to_first_inference_s"):
        assert 0 < row[f"warm_{key}"] and 0 < row[f"cold_{key}"]
        assert row[f"warm_over_cold_{key}"] == row[f"warm_{key}"] / row[f"cold_{key}"]
