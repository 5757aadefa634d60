"""Small test models beyond the examples: a BYTES model (ONNX StringNormalizer), an embedding
lookup whose failure depends on the data, models with types the agent does not serve, and
models whose dynamic dimensions are not all a batch (NonZero, a dynamic-resolution Conv)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runtimes.golden import GoldenSample

# a graph's input or output: a name, an element type and a shape
_tensor = helper.make_tensor_value_info


def write_upper_model(repository: Path, name: str = "upper") -> Path:
    """BYTES in, BYTES out: upper-cases each string (a real ONNX operator run by ONNX Runtime)."""
    node = helper.make_node(
        "StringNormalizer", ["text"], ["upper"], case_change_action="UPPER", locale="C"
    )
    text = _tensor("text", TensorProto.STRING, ["N"])
    upper = _tensor("upper", TensorProto.STRING, ["N"])
    graph = helper.make_graph([node], name, [text], [upper])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    version_dir = repository / name / "1"
    version_dir.mkdir(parents=True)
    onnx.save(model, version_dir / "model.onnx")
    GoldenSample(
        {"text": np.array([b"edge", b"fleet"], dtype=object)},
        {"upper": np.array([b"EDGE", b"FLEET"], dtype=object)},
    ).save(version_dir / "golden.npz")
    return version_dir


EMBEDDING_ROWS = 10
EMBEDDING_WIDTH = 4


def embedding_table() -> np.ndarray:
    """The rows :func:`write_embedding_model` looks up: row ``i`` holds ``4i .. 4i+3``."""
    return np.arange(EMBEDDING_ROWS * EMBEDDING_WIDTH, dtype=np.float32).reshape(
        EMBEDDING_ROWS, EMBEDDING_WIDTH
    )


def write_embedding_model(repository: Path, name: str = "emb", config: str = "") -> Path:
    """INT64 indices in, FP32 rows out (Gather on a table): an index past the table fails only
    when the model runs, so whether a batch fails depends on one request's data."""
    table = numpy_helper.from_array(embedding_table(), "table")
    gather = helper.make_node("Gather", ["table", "index"], ["vector"], axis=0)
    index = _tensor("index", TensorProto.INT64, ["N"])
    vector = _tensor("vector", TensorProto.FLOAT, ["N", EMBEDDING_WIDTH])
    graph = helper.make_graph([gather], name, [index], [vector], [table])
    return _save(graph, repository, name, config)


def write_bf16_input_model(repository: Path, name: str = "bf16") -> Path:
    """A BF16 input (cast to FP32): ONNX Runtime loads it, the agent has no numpy type for it."""
    cast = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)
    x = _tensor("x", TensorProto.BFLOAT16, ["N", 2])
    y = _tensor("y", TensorProto.FLOAT, ["N", 2])
    graph = helper.make_graph([cast], name, [x], [y])
    return _save(graph, repository, name)


def write_sequence_output_model(repository: Path, name: str = "seqout") -> Path:
    """An output that is a sequence of tensors, not a tensor (as skl2onnx's ZipMap gives)."""
    sequence = helper.make_sequence_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, ["N"])
    )
    construct = helper.make_node("SequenceConstruct", ["x"], ["s"])
    x = _tensor("x", TensorProto.FLOAT, ["N"])
    s = helper.make_value_info("s", sequence)
    graph = helper.make_graph([construct], name, [x], [s])
    return _save(graph, repository, name)


def write_nonzero_model(repository: Path, name: str = "hits") -> Path:
    """FP32 ``[N, 4]`` in, the INT64 ``[K, 2]`` indices of its non-zero values out: every
    tensor's first dimension is dynamic, but the output's is not the batch."""
    nonzero = helper.make_node("NonZero", ["x"], ["nz"])
    transpose = helper.make_node("Transpose", ["nz"], ["hits"], perm=[1, 0])
    x = _tensor("x", TensorProto.FLOAT, ["N", 4])
    hits = _tensor("hits", TensorProto.INT64, ["K", 2])
    graph = helper.make_graph([nonzero, transpose], name, [x], [hits])
    return _save(graph, repository, name)


def write_dynamic_conv_model(repository: Path, name: str = "conv") -> Path:
    """A 3x3 convolution of a ``[N, 1, H, W]`` image of any size of at least 3x3 (all-ones
    kernel, no padding): zeros of 1x1 cannot run it."""
    kernel = numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "kernel")
    conv = helper.make_node("Conv", ["image", "kernel"], ["sums"], kernel_shape=[3, 3])
    image = _tensor("image", TensorProto.FLOAT, ["N", 1, "H", "W"])
    sums = _tensor("sums", TensorProto.FLOAT, ["N", 1, "H2", "W2"])
    graph = helper.make_graph([conv], name, [image], [sums], [kernel])
    return _save(graph, repository, name)


REGRESSION_WEIGHTS = np.array([[0.5], [-1.0], [2.0], [0.25]], dtype=np.float32)
"""The weights of :func:`write_regression_model`: ``y = x @ W + 1``."""


def write_regression_model(repository: Path, name: str = "price", config: str = "") -> Path:
    """FP32 ``x [N, 4]`` in, one FP32 value ``y [N, 1]`` per row out (MatMul and Add)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])
    w = numpy_helper.from_array(REGRESSION_WEIGHTS, "w")
    b = numpy_helper.from_array(np.ones(1, dtype=np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["y"]),
    ]
    graph = helper.make_graph(nodes, name, [x], [y], [w, b])
    return _save(graph, repository, name, config)


def _save(graph: onnx.GraphProto, repository: Path, name: str, config: str = "") -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    version_dir = repository / name / "1"
    version_dir.mkdir(parents=True)
    onnx.save(model, version_dir / "model.onnx")
    if config:
        (repository / name / "config.toml").write_text(config)
    return version_dir
