"""More versions of the example MLP, for updates in tests and the demo: other weights, the same
model as a .tflite file, and a "fragile" version that passes its self-test but fails on some
live traffic (what a fleet's health gates must catch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runtimes.examples.onnx_models import IR_VERSION, OPSET, mlp_onnx
from runtimes.examples.reference import mlp_forward
from runtimes.examples.weights import mlp_layers
from runtimes.golden import GOLDEN_FILE, GoldenSample

GOLDEN_X = np.random.default_rng(11).standard_normal((4, 256)).astype(np.float32)


def mlp_version(directory: Path, seed: int) -> Path:
    """An MLP with the example's signature and weights drawn from ``seed``."""
    directory.mkdir(parents=True, exist_ok=True)
    layers = mlp_layers(seed)
    onnx.save(mlp_onnx(layers), directory / "model.onnx")
    GoldenSample(
        {"input": GOLDEN_X}, {"logits": mlp_forward(GOLDEN_X, layers).astype(np.float32)}
    ).save(directory / GOLDEN_FILE)
    return directory


def fragile_mlp_version(directory: Path, seed: int) -> Path:
    """The MLP plus a Gather whose index goes out of range when input[:, 0] > 100: it passes
    its golden self-test and fails at run time on such traffic (ONNX Runtime refuses it)."""
    mlp_version(directory, seed)
    model = onnx.load(directory / "model.onnx")
    g = model.graph
    g.output[0].name = "logits"
    for node in g.node:
        node.output[:] = ["mlp_logits" if o == "logits" else o for o in node.output]
    initializers = [
        numpy_helper.from_array(np.array([0], np.int64), "f.starts"),
        numpy_helper.from_array(np.array([1], np.int64), "f.ends"),
        numpy_helper.from_array(np.array([1], np.int64), "f.axes"),
        numpy_helper.from_array(np.array(100.0, np.float32), "f.limit"),
        numpy_helper.from_array(np.array(1000, np.int64), "f.scale"),
        numpy_helper.from_array(np.array([-1], np.int64), "f.flat"),
        numpy_helper.from_array(np.zeros((1, 10), np.float32), "f.table"),
    ]
    nodes = [
        helper.make_node("Slice", ["input", "f.starts", "f.ends", "f.axes"], ["f.first"]),
        helper.make_node("Greater", ["f.first", "f.limit"], ["f.big"]),
        helper.make_node("Cast", ["f.big"], ["f.bigi"], to=TensorProto.INT64),
        helper.make_node("Mul", ["f.bigi", "f.scale"], ["f.idx2"]),
        helper.make_node("Reshape", ["f.idx2", "f.flat"], ["f.idx"]),
        helper.make_node("Gather", ["f.table", "f.idx"], ["f.rows"], axis=0),
        helper.make_node("Add", ["mlp_logits", "f.rows"], ["logits"]),
    ]
    g.initializer.extend(initializers)
    g.node.extend(nodes)
    model.ir_version = IR_VERSION
    del model.opset_import[:]
    model.opset_import.extend([helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    onnx.save(model, directory / "model.onnx")
    return directory


def mlp_tflite_version(directory: Path, seed: int) -> Path:
    """The same MLP as :func:`mlp_version`, as a .tflite flatbuffer."""
    from runtimes.examples.tflite_models import mlp_tflite

    directory.mkdir(parents=True, exist_ok=True)
    layers = mlp_layers(seed)
    (directory / "model.tflite").write_bytes(mlp_tflite(layers))
    GoldenSample(
        {"input": GOLDEN_X}, {"logits": mlp_forward(GOLDEN_X, layers).astype(np.float32)}
    ).save(directory / GOLDEN_FILE)
    return directory
