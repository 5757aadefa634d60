"""The INT8 variant computes the same on x86 with and without VNNI: its weights are 7-bit, so
AVX2's u8 x s8 pair sums (vpmaddubsw, into an int16) never saturate, where full 8-bit weights
made a variant judged on a VNNI machine answer differently on an AVX2-only one (max abs diff
3.04 against < 1). Checked on the built file itself: no host here lacks VNNI to run it on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from control_plane.quality.optimise import build_int8
from control_plane.quality.reference import load_reference

INT16_MAX = 2**15 - 1


def test_int8_weights_fit_avx2s_int16_pair_sums(examples: Path, tmp_path: Path) -> None:
    version = examples / "digits" / "1"
    target = tmp_path / "int8.onnx"
    build_int8(version / "model.onnx", target, load_reference(version / "reference.npz"))
    weights = [
        numpy_helper.to_array(t)
        for t in onnx.load(str(target)).graph.initializer
        if t.data_type == onnx.TensorProto.INT8 and t.dims and np.prod(t.dims) > 16
    ]
    assert weights  # the matrices were quantised at all
    widest = max(int(np.abs(w.astype(np.int32)).max()) for w in weights)
    assert widest <= 64, widest
    assert 2 * 255 * widest <= INT16_MAX  # two u8 activations times two weights, one int16
