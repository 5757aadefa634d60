"""The example MLP as a real ``.tflite`` flatbuffer, built from LiteRT's own schema module.

No TensorFlow is needed: ``schema_py_generated`` is the flatbuffer schema LiteRT ships, and
its object API packs a model the interpreter loads like any converter output.
"""

from __future__ import annotations

from typing import Any

import flatbuffers
import numpy as np

from runtimes.examples.weights import Dense

_TFLITE_IDENTIFIER = b"TFL3"
_SCHEMA_VERSION = 3


def _schema() -> Any:
    try:
        from ai_edge_litert import schema_py_generated as schema
    except ImportError:  # pragma: no cover - only on installs without LiteRT
        from tflite_runtime import schema_py_generated as schema
    return schema


def mlp_tflite(layers: list[Dense]) -> bytes:
    """FULLY_CONNECTED (+ fused RELU) layers; batch dimension dynamic via shape_signature."""
    schema = _schema()
    buffers = [schema.BufferT()]  # buffer 0 is the empty sentinel by convention
    tensors = []

    def tensor(name: str, shape: list[int], data: np.ndarray | None = None, batched=False):  # type: ignore[no-untyped-def]
        t = schema.TensorT()
        t.name = name
        t.type = schema.TensorType.FLOAT32
        t.shape = shape
        if batched:
            t.shapeSignature = [-1] + shape[1:]
        t.buffer = 0
        if data is not None:
            buf = schema.BufferT()
            buf.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
            buffers.append(buf)
            t.buffer = len(buffers) - 1
        tensors.append(t)
        return len(tensors) - 1

    code = schema.OperatorCodeT()
    code.builtinCode = schema.BuiltinOperator.FULLY_CONNECTED
    code.deprecatedBuiltinCode = schema.BuiltinOperator.FULLY_CONNECTED
    code.version = 1

    operators = []
    x = tensor("input", [1, int(layers[0].weight.shape[1])], batched=True)
    graph_input = x
    for i, layer in enumerate(layers):
        w = tensor(f"fc{i}.weight", list(layer.weight.shape), layer.weight)
        b = tensor(f"fc{i}.bias", list(layer.bias.shape), layer.bias)
        name = "logits" if i == len(layers) - 1 else f"fc{i}.out"
        out = tensor(name, [1, int(layer.weight.shape[0])], batched=True)
        opts = schema.FullyConnectedOptionsT()
        opts.fusedActivationFunction = (
            schema.ActivationFunctionType.RELU if layer.relu else schema.ActivationFunctionType.NONE
        )
        op = schema.OperatorT()
        op.opcodeIndex = 0
        op.inputs = [x, w, b]
        op.outputs = [out]
        op.builtinOptionsType = schema.BuiltinOptions.FullyConnectedOptions
        op.builtinOptions = opts
        operators.append(op)
        x = out

    subgraph = schema.SubGraphT()
    subgraph.tensors = tensors
    subgraph.inputs = [graph_input]
    subgraph.outputs = [x]
    subgraph.operators = operators
    subgraph.name = "main"

    model = schema.ModelT()
    model.version = _SCHEMA_VERSION
    model.operatorCodes = [code]
    model.subgraphs = [subgraph]
    model.buffers = buffers
    model.description = "edgefleet example mlp"

    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=_TFLITE_IDENTIFIER)
    return bytes(builder.Output())


def custom_op_tflite(op_name: str) -> bytes:
    """A one-operator model whose operator is a custom op no interpreter has: a test fixture
    for the "unsupported operator" error."""
    schema = _schema()
    tensors = []
    for name in ("x", "y"):
        t = schema.TensorT()
        t.name, t.type, t.shape, t.buffer = name, schema.TensorType.FLOAT32, [1, 4], 0
        tensors.append(t)
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode = op_name
    code.version = 1
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0], [1]
    subgraph = schema.SubGraphT()
    subgraph.tensors, subgraph.inputs, subgraph.outputs, subgraph.operators = (
        tensors,
        [0],
        [1],
        [op],
    )
    model = schema.ModelT()
    model.version, model.operatorCodes, model.subgraphs = _SCHEMA_VERSION, [code], [subgraph]
    model.buffers = [schema.BufferT()]
    builder = flatbuffers.Builder(256)
    builder.Finish(model.Pack(builder), file_identifier=_TFLITE_IDENTIFIER)
    return bytes(builder.Output())
