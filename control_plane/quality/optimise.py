"""Optimised variants of an ONNX model, built and judged on the version's reference set
(blocking; the API runs it in a thread).

- ``int8``: ONNX Runtime static quantisation (QOperator, per-channel U8S8), calibrated on the
  reference inputs, for profiles whose first ONNX choice is ONNX Runtime on the CPU.
- ``fp16``: ``onnxconverter-common``'s float16 conversion (I/O kept float32), for profiles
  whose first ONNX choice is ONNX Runtime on a GPU.
- ``openvino_int8``: OpenVINO IR quantised by NNCF on the reference inputs, for profiles whose
  first ONNX choice is OpenVINO.

Each variant runs on the reference set next to the FP32 model. With labels, it is refused when
its accuracy falls more than ``max_accuracy_drop`` below the FP32 model's; without labels, when
its top-1 agreement with the FP32 answers falls below ``1 - max_accuracy_drop``. The report
carries the numbers either way (accuracy of both, agreement, largest absolute difference).
"""

from __future__ import annotations

import tempfile
import warnings
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from control_plane.quality.reference import ReferenceSet
from runtimes.hardware.profile import default_profiles_dir, load_profiles

CALIBRATION_ROWS = 256
BATCH_ROWS = 64


class VariantKind(StrEnum):
    INT8 = "int8"
    FP16 = "fp16"
    OPENVINO_INT8 = "openvino_int8"


class Outcome(StrEnum):
    BUILT = "built"
    REFUSED = "refused"
    UNAVAILABLE = "unavailable"
    """The tool that builds it is missing here, or no profile wants it."""


def profiles_for(kind: VariantKind, profiles_dir: Path | None = None) -> list[str]:
    """The profiles whose first ONNX preference this kind of variant serves: ONNX Runtime on
    the CPU (int8), on a GPU (fp16), or OpenVINO on any device (openvino_int8)."""
    names = []
    for profile in load_profiles(profiles_dir or default_profiles_dir()):
        first = next(iter(profile.preferences.get("onnx", ())), None)  # type: ignore[call-overload]
        if first is None:
            continue
        if kind is VariantKind.OPENVINO_INT8:
            wanted = first.runtime == "openvino"
        else:
            device = "CPU" if kind is VariantKind.INT8 else "GPU"
            wanted = first.runtime == "onnxruntime" and first.device == device
        if wanted:
            names.append(profile.name)
    return names


def run_model(path: Path, reference: ReferenceSet) -> dict[str, np.ndarray]:
    """The model's outputs over the whole reference set (ONNX Runtime, or OpenVINO for IR;
    CPU, in batches)."""
    if path.suffix == ".xml":
        return _run_openvino(path, reference)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for batch in reference.batches(BATCH_ROWS):
        for name, value in zip(names, session.run(names, batch), strict=True):
            parts[name].append(np.asarray(value))
    return {n: np.concatenate(v) for n, v in parts.items()}


def _run_openvino(path: Path, reference: ReferenceSet) -> dict[str, np.ndarray]:
    import openvino as ov

    compiled = ov.Core().compile_model(str(path), "CPU")
    names = [o.get_any_name() for o in compiled.outputs]
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for batch in reference.batches(BATCH_ROWS):
        result = compiled(batch)
        for name, port in zip(names, compiled.outputs, strict=True):
            parts[name].append(np.asarray(result[port]))
    return {n: np.concatenate(v) for n, v in parts.items()}


def judge(
    fp32: dict[str, np.ndarray], variant: dict[str, np.ndarray], labels: np.ndarray | None
) -> dict[str, Any]:
    """Accuracy (with labels), top-1 agreement and the largest absolute difference, on the
    first output."""
    name = next(iter(fp32))
    ref = fp32[name].reshape(len(fp32[name]), -1).astype(np.float64)
    got = variant[name].reshape(len(ref), -1).astype(np.float64)
    top_ref, top_got = ref.argmax(axis=1), got.argmax(axis=1)
    doc: dict[str, Any] = {
        "output": name,
        "rows": len(ref),
        "agreement": float(np.mean(top_ref == top_got)),
        "max_abs_diff": float(np.max(np.abs(got - ref))),
        "accuracy_fp32": None,
        "accuracy": None,
        "accuracy_delta": None,
    }
    if labels is not None:
        doc["accuracy_fp32"] = float(np.mean(top_ref == labels))
        doc["accuracy"] = float(np.mean(top_got == labels))
        doc["accuracy_delta"] = doc["accuracy"] - doc["accuracy_fp32"]
    return doc


def refusal(numbers: dict[str, Any], max_accuracy_drop: float) -> str | None:
    """Why a variant with these numbers is refused, or None."""
    if numbers["accuracy_delta"] is not None:
        drop = -numbers["accuracy_delta"]
        if drop > max_accuracy_drop:
            return (
                f"accuracy {numbers['accuracy']:.4f} vs FP32 {numbers['accuracy_fp32']:.4f}: "
                f"a drop of {drop * 100:.2f} points, over the limit of "
                f"{max_accuracy_drop * 100:.2f}"
            )
        return None
    if 1 - numbers["agreement"] > max_accuracy_drop:
        return (
            f"top-1 agreement with FP32 {numbers['agreement']:.4f} is below "
            f"{1 - max_accuracy_drop:.4f} (max abs diff {numbers['max_abs_diff']:.3g})"
        )
    return None


def build_int8(source: Path, target: Path, reference: ReferenceSet) -> None:
    """Static INT8 quantisation calibrated on (up to 256 rows of) the reference inputs."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    rows = [
        {k: v[i : i + 1] for k, v in reference.inputs.items()}
        for i in range(min(reference.rows, CALIBRATION_ROWS))
    ]

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._rows = iter(rows)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._rows, None)

    with tempfile.TemporaryDirectory() as scratch:
        # NOTE: ORT's quantisation guide runs the pre-processing (shape inference, graph
        # optimisation) first; it lets more nodes be quantised.
        prepared = Path(scratch) / "prepared.onnx"
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        quantize_static(
            str(prepared),
            str(target),
            Reader(),
            # QOperator (QLinearConv, MatMulInteger) U8S8: 1.9x FP32 on the CNN example here,
            # where QDQ S8S8 gave 1.3x (benchmarks/quality). NOTE: U8S8 saturates on x86 with
            # AVX2 but no VNNI (vpmaddubsw adds two u8 x s8 products into an int16: 255 x 127
            # x 2 > 32767), where VNNI does not: the same variant answered differently there
            # (max abs diff 3.04 against < 1 here). 7-bit weights (reduce_range, ORT's
            # quantization guide) keep every pair within int16, so both kernels compute the
            # same integers and the accuracy judged here holds on either CPU.
            quant_format=QuantFormat.QOperator,
            per_channel=True,
            reduce_range=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )


def build_fp16(source: Path, target: Path) -> None:
    import onnx
    from onnxconverter_common import float16

    with warnings.catch_warnings():
        # it warns for each weight it clamps to FP16's range: expected, and the reference set
        # judges the result
        warnings.filterwarnings("ignore", message=".*will be truncated", category=UserWarning)
        model = float16.convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
    onnx.save(model, str(target))


def build_openvino_int8(source: Path, target: Path, reference: ReferenceSet) -> None:
    """OpenVINO IR (``target`` is the .xml; its .bin beside it), INT8 through NNCF's
    post-training quantisation on (up to 300 rows of) the reference inputs."""
    import nncf
    import openvino as ov

    rows = [
        {k: v[i : i + 1] for k, v in reference.inputs.items()}
        for i in range(min(reference.rows, 300))
    ]
    model = ov.convert_model(str(source))
    quantised = nncf.quantize(model, nncf.Dataset(rows), subset_size=len(rows))
    ov.save_model(quantised, str(target), compress_to_fp16=False)


def missing_tool(kind: VariantKind) -> str | None:
    """What the control plane lacks to build ``kind``, or None."""
    needs = {
        VariantKind.FP16: ("onnxconverter_common", "onnxconverter-common"),
        VariantKind.OPENVINO_INT8: ("nncf", "nncf (and openvino)"),
    }
    if kind not in needs:
        return None
    module, package = needs[kind]
    try:
        __import__(module)
        if kind is VariantKind.OPENVINO_INT8:
            __import__("openvino")
    except ImportError:
        return f"{package} is not installed on the control plane"
    return None
