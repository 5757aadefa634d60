"""Small test models beyond the examples: a BYTES model (ONNX StringNormalizer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from runtimes.golden import GoldenSample


def write_upper_model(repository: Path, name: str = "upper") -> Path:
    """BYTES in, BYTES out: upper-cases each string (a real ONNX operator run by ONNX Runtime)."""
    node = helper.make_node(
        "StringNormalizer", ["text"], ["upper"], case_change_action="UPPER", locale="C"
    )
    graph = helper.make_graph(
        [node], name,
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("upper", TensorProto.STRING, ["N"])],
    )  # fmt: skip
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
