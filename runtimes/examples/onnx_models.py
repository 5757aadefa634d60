"""The example models as ONNX graphs, built with the ``onnx`` helper API."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runtimes.examples.weights import Conv, Dense

# Opset 17 and IR version 8 load on every ONNX Runtime and OpenVINO release we support.
OPSET = 17
IR_VERSION = 8


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edgefleet"
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def _dense_nodes(
    x: str, out: str, layer: Dense, prefix: str, inits: list[onnx.TensorProto]
) -> list[onnx.NodeProto]:
    inits += [
        numpy_helper.from_array(layer.weight, f"{prefix}.weight"),
        numpy_helper.from_array(layer.bias, f"{prefix}.bias"),
    ]
    gemm_out = f"{prefix}.gemm" if layer.relu else out
    nodes = [
        helper.make_node(
            "Gemm",
            [x, f"{prefix}.weight", f"{prefix}.bias"],
            [gemm_out],
            transB=1,
            name=f"{prefix}.Gemm",
        )
    ]
    if layer.relu:
        nodes.append(helper.make_node("Relu", [gemm_out], [out], name=f"{prefix}.Relu"))
    return nodes


def mlp_onnx(layers: list[Dense]) -> onnx.ModelProto:
    """[N, 256] float32 -> Gemm+Relu -> Gemm+Relu -> Gemm -> [N, 10] logits."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    x = "input"
    for i, layer in enumerate(layers):
        out = "logits" if i == len(layers) - 1 else f"fc{i}.out"
        nodes += _dense_nodes(x, out, layer, f"fc{i}", inits)
        x = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [
            helper.make_tensor_value_info(
                "input", TensorProto.FLOAT, ["N", layers[0].weight.shape[1]]
            )
        ],
        [
            helper.make_tensor_value_info(
                "logits", TensorProto.FLOAT, ["N", layers[-1].weight.shape[0]]
            )
        ],
        inits,
    )
    return _model(graph)


def cnn_onnx(convs: list[Conv], head: Dense, image_size: int = 224) -> onnx.ModelProto:
    """MobileNetV2-like network: [N, 3, H, W] float32 -> [N, 1000] logits."""
    nodes: list[onnx.NodeProto] = []
    inits = [
        numpy_helper.from_array(np.array(0.0, np.float32), "relu6.min"),
        numpy_helper.from_array(np.array(6.0, np.float32), "relu6.max"),
    ]
    block_inputs: dict[int, str] = {}
    x = "input"
    for i, layer in enumerate(convs):
        block_inputs[i] = x
        p = f"conv{i}"
        inits += [
            numpy_helper.from_array(layer.weight, f"{p}.weight"),
            numpy_helper.from_array(layer.bias, f"{p}.bias"),
        ]
        pad = layer.kernel // 2
        out = f"{p}.out"
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{p}.weight", f"{p}.bias"],
                [out],
                name=f"{p}.Conv",
                kernel_shape=[layer.kernel] * 2,
                strides=[layer.stride] * 2,
                pads=[pad] * 4,
                group=layer.groups,
            )
        )
        if layer.relu6:
            nodes.append(
                helper.make_node(
                    "Clip", [out, "relu6.min", "relu6.max"], [f"{p}.relu6"], name=f"{p}.Relu6"
                )
            )
            out = f"{p}.relu6"
        if layer.residual_from is not None:
            nodes.append(
                helper.make_node(
                    "Add", [out, block_inputs[layer.residual_from]], [f"{p}.add"], name=f"{p}.Add"
                )
            )
            out = f"{p}.add"
        x = out
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], axis=1, name="flatten"))
    nodes += _dense_nodes("flat", "logits", head, "classifier", inits)
    graph = helper.make_graph(
        nodes,
        "cnn",
        [
            helper.make_tensor_value_info(
                "input", TensorProto.FLOAT, ["N", 3, image_size, image_size]
            )
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", head.weight.shape[0]])],
        inits,
    )
    return _model(graph)
