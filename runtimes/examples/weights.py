"""Deterministic weights for the example models, shared by every format and the reference."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MLP_SIZES = (256, 1024, 1024, 10)
SEED = 20261202

# MobileNetV2 1.0 inverted residual settings: expansion t, channels c, repeats n, stride s.
MOBILENET_V2_BLOCKS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)
CNN_CLASSES = 1000
CNN_STEM_CHANNELS = 32
CNN_HEAD_CHANNELS = 1280


@dataclass(frozen=True)
class Dense:
    weight: np.ndarray  # [out, in], as ONNX Gemm with transB=1 and TFLite FULLY_CONNECTED
    bias: np.ndarray  # [out]
    relu: bool


@dataclass(frozen=True)
class Conv:
    weight: np.ndarray  # [out, in / groups, k, k]
    bias: np.ndarray
    stride: int
    groups: int
    relu6: bool
    residual_from: int | None = None  # index of the layer whose *input* is added to the output

    @property
    def kernel(self) -> int:
        return int(self.weight.shape[-1])


def _he(
    rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, gain: float = 1.0
) -> np.ndarray:
    scale = gain * np.sqrt(2.0 / fan_in)
    return np.asarray(rng.standard_normal(shape) * scale, dtype=np.float32)


def mlp_layers(seed: int = SEED) -> list[Dense]:
    rng = np.random.default_rng(seed)
    layers = []
    for i, (n_in, n_out) in enumerate(zip(MLP_SIZES, MLP_SIZES[1:], strict=False)):
        layers.append(
            Dense(
                weight=_he(rng, (n_out, n_in), n_in),
                bias=(rng.standard_normal(n_out) * 0.01).astype(np.float32),
                relu=i < len(MLP_SIZES) - 2,
            )
        )
    return layers


def cnn_layers(seed: int = SEED + 1) -> tuple[list[Conv], Dense]:
    """Convolutions of a MobileNetV2 1.0 (batch norm folded into biases) and the classifier."""
    rng = np.random.default_rng(seed)
    convs: list[Conv] = []

    def conv(
        c_in: int,
        c_out: int,
        k: int,
        stride: int,
        groups: int,
        relu6: bool,
        gain: float = 1.0,
        residual_from: int | None = None,
    ) -> None:
        fan_in = (c_in // groups) * k * k
        convs.append(
            Conv(
                weight=_he(rng, (c_out, c_in // groups, k, k), fan_in, gain),
                bias=(rng.standard_normal(c_out) * 0.01).astype(np.float32),
                stride=stride,
                groups=groups,
                relu6=relu6,
                residual_from=residual_from,
            )
        )

    conv(3, CNN_STEM_CHANNELS, 3, 2, 1, True)
    c_in = CNN_STEM_CHANNELS
    for t, c, n, s in MOBILENET_V2_BLOCKS:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = c_in * t
            block_start = len(convs)
            if t != 1:
                conv(c_in, hidden, 1, 1, 1, True)
            conv(hidden, hidden, 3, stride, hidden, True)
            residual = block_start if stride == 1 and c_in == c else None
            # NOTE: a smaller gain on the linear projection keeps the residual stream's
            # variance bounded through 17 blocks of random (untrained) weights.
            conv(hidden, c, 1, 1, 1, False, gain=0.5, residual_from=residual)
            c_in = c
    conv(c_in, CNN_HEAD_CHANNELS, 1, 1, 1, True)
    head = Dense(
        weight=_he(rng, (CNN_CLASSES, CNN_HEAD_CHANNELS), CNN_HEAD_CHANNELS),
        bias=np.zeros(CNN_CLASSES, np.float32),
        relu=False,
    )
    return convs, head


def cnn_multiply_adds(image_size: int = 224) -> int:
    """Multiply-adds of one image through :func:`cnn_layers`, to check the MobileNet scale."""
    convs, head = cnn_layers()
    size, total = image_size, 0
    for c in convs:
        size = (size + c.stride - 1) // c.stride
        out_ch, in_per_group, k, _ = c.weight.shape
        total += out_ch * in_per_group * k * k * size * size
    return total + head.weight.size
