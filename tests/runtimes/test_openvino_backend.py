"""OpenVINO specifics the contract suite does not reach: tensor names as the model file
declares them, virtual devices, an unusable cache directory, string tensors."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from runtimes.backends import open_model
from runtimes.base import Placement
from runtimes.errors import DeviceUnavailableError, UnsupportedModelError
from runtimes.golden import GOLDEN_FILE, GoldenSample
from runtimes.settings import RuntimeSettings

openvino = pytest.importorskip("openvino")


def _save(
    path: Path,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _identity_output_onnx(path: Path) -> Path:
    """x -> Relu -> a_hidden -> Identity -> scores, and a_hidden -> Sigmoid -> probs: OpenVINO
    folds the Identity, so one compiled port carries both a_hidden and scores."""
    return _save(
        path,
        [
            helper.make_node("Relu", ["x"], ["a_hidden"]),
            helper.make_node("Identity", ["a_hidden"], ["scores"]),
            helper.make_node("Sigmoid", ["a_hidden"], ["probs"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 4]),
        ],
    )


def _placement(runtime_name: str, device: str = "CPU") -> Placement:
    providers = ("CPUExecutionProvider",) if runtime_name == "onnxruntime" else ()
    return Placement(runtime=runtime_name, device=device, providers=providers)  # type: ignore[arg-type]


@pytest.mark.parametrize("runtime_name", ["onnxruntime", "openvino"])
def test_output_copied_by_identity_keeps_the_name_the_graph_declares(
    runtime_name: str, tmp_path: Path
) -> None:
    path = _identity_output_onnx(tmp_path / "identity_out.onnx")
    runtime = open_model(path, _placement(runtime_name))
    try:
        assert runtime.signature.output_names() == ["scores", "probs"]
        x = np.array([[-1.0, 0.0, 0.5, 2.0]], np.float32)
        out = runtime.infer({"x": x})
        assert list(out) == ["scores", "probs"]
        np.testing.assert_allclose(out["scores"], np.maximum(x, 0))
        np.testing.assert_allclose(out["probs"], 1 / (1 + np.exp(-np.maximum(x, 0))), rtol=1e-5)
    finally:
        runtime.close()


def test_ir_output_copied_by_identity_keeps_the_name_the_model_declares(tmp_path: Path) -> None:
    onnx_path = _identity_output_onnx(tmp_path / "identity_out.onnx")
    # Read and saved as is: convert_model() would fold the Identity away before saving, and
    # the IR keep a single name for the port.
    xml = tmp_path / "identity_out.xml"
    model = openvino.Core().read_model(str(onnx_path))
    openvino.save_model(model, str(xml), compress_to_fp16=False)
    runtime = open_model(xml, _placement("openvino"))
    try:
        assert runtime.signature.output_names() == ["scores", "probs"]
        assert list(runtime.infer({"x": np.ones((2, 4), np.float32)})) == ["scores", "probs"]
    finally:
        runtime.close()


def test_auto_runs_on_the_listed_device_that_is_present(example_repo: Path) -> None:
    """AUTO and MULTI need one of their devices: AUTO:NPU,CPU runs on a machine without NPU."""
    golden = GoldenSample.load(example_repo / "mlp/1" / GOLDEN_FILE)
    for device in ("AUTO:NPU,CPU", "MULTI:NPU,CPU"):
        runtime = open_model(example_repo / "mlp/1/model.onnx", _placement("openvino", device))
        try:
            out = runtime.infer(golden.inputs)["logits"]
            # the CPU computes in f32 under AUTO and MULTI too, as it does plain
            np.testing.assert_allclose(out, golden.outputs["logits"], rtol=1e-4, atol=1e-5)
            # AUTO reports "(CPU)" while it still serves on the CPU it started on
            devices = runtime.compiled_property("EXECUTION_DEVICES")
            assert [d.strip("()") for d in devices] == ["CPU"]
        finally:
            runtime.close()


def test_virtual_device_without_its_devices_is_device_unavailable(example_repo: Path) -> None:
    available = openvino.Core().available_devices
    if any(d.split(".")[0] in ("NPU", "GPU") for d in available):
        pytest.skip(f"this machine has an NPU or GPU: {available}")
    model = example_repo / "mlp/1/model.onnx"
    with pytest.raises(DeviceUnavailableError, match="device NPU, GPU not present"):
        open_model(model, _placement("openvino", "AUTO:NPU,GPU"))
    # HETERO splits the model across all of its devices: each one must be present.
    with pytest.raises(DeviceUnavailableError, match="device NPU not present"):
        open_model(model, _placement("openvino", "HETERO:NPU,CPU"))


def test_cache_dir_that_cannot_be_created_loads_without_a_cache(
    example_repo: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A regular file where the cache directory should be: not writable even for root.
    blocker = tmp_path / "cache"
    blocker.write_text("not a directory")
    golden = GoldenSample.load(example_repo / "mlp/1" / GOLDEN_FILE)
    with caplog.at_level(logging.WARNING, logger="edgefleet.runtimes"):
        runtime = open_model(
            example_repo / "mlp/1/model.onnx",
            _placement("openvino"),
            RuntimeSettings(cache_dir=blocker),
        )
    try:
        assert golden.mismatches(runtime.infer(golden.inputs)) == []
    finally:
        runtime.close()
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert f"not caching compiled models in {blocker / 'openvino'}" in caplog.text


LABELS = helper.make_tensor("names", TensorProto.STRING, [2], [b"cat", b"dog"])


@pytest.mark.parametrize(
    ("nodes", "inputs", "outputs", "tensor"),
    [
        (
            [helper.make_node("Identity", ["s"], ["o"])],
            [helper.make_tensor_value_info("s", TensorProto.STRING, ["N", 2])],
            [helper.make_tensor_value_info("o", TensorProto.STRING, ["N", 2])],
            "input 's'",
        ),
        (
            [
                helper.make_node("Relu", ["x"], ["y"]),
                helper.make_node("Constant", [], ["labels"], value=LABELS),
            ],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
            [
                helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2]),
                helper.make_tensor_value_info("labels", TensorProto.STRING, [2]),
            ],
            "output 'labels'",
        ),
    ],
    ids=["string-input", "string-output"],
)
def test_string_tensors_are_refused_at_load_naming_the_tensor(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    tensor: str,
    tmp_path: Path,
) -> None:
    """OpenVINO cannot take the agent's BYTES arrays, and aborts the process at exit after
    a string inference: such a model is refused before anything runs."""
    path = _save(tmp_path / "strings.onnx", nodes, inputs, outputs)
    with pytest.raises(UnsupportedModelError, match=f"{tensor} holds strings") as info:
        open_model(path, _placement("openvino"))
    assert info.value.code == "model_unsupported" and "strings.onnx" in str(info.value)
