"""Numpy forward passes of the example models, independent of every runtime.

Golden outputs come from here, in float64, so a backend is checked against arithmetic it did
not produce itself.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from runtimes.examples.weights import Conv, Dense


def dense(x: np.ndarray, layer: Dense) -> np.ndarray:
    y = x @ layer.weight.T.astype(np.float64) + layer.bias
    return np.asarray(np.maximum(y, 0.0) if layer.relu else y)


def mlp_forward(x: np.ndarray, layers: list[Dense]) -> np.ndarray:
    y = x.astype(np.float64)
    for layer in layers:
        y = dense(y, layer)
    return y


def conv2d(x: np.ndarray, layer: Conv) -> np.ndarray:
    """NCHW convolution with 'same' padding for odd kernels, as the ONNX graph declares."""
    k, stride = layer.kernel, layer.stride
    w = layer.weight.astype(np.float64)
    if k == 1:
        y = np.einsum("nchw,oc->nohw", x[:, :, ::stride, ::stride], w[:, :, 0, 0])
    else:
        pad = k // 2
        padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        windows = sliding_window_view(padded, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
        if layer.groups == 1:
            y = np.einsum("nchwij,ocij->nohw", windows, w, optimize=True)
        else:  # depthwise: one filter per channel
            y = np.einsum("nchwij,cij->nchw", windows, w[:, 0], optimize=True)
    y = y + layer.bias.astype(np.float64)[None, :, None, None]
    return np.asarray(np.clip(y, 0.0, 6.0) if layer.relu6 else y)


def cnn_forward(x: np.ndarray, convs: list[Conv], head: Dense) -> np.ndarray:
    y = x.astype(np.float64)
    block_inputs: dict[int, np.ndarray] = {}
    for i, layer in enumerate(convs):
        block_inputs[i] = y
        out = conv2d(y, layer)
        if layer.residual_from is not None:
            out = out + block_inputs[layer.residual_from]
        y = out
    pooled = y.mean(axis=(2, 3))
    return dense(pooled, head)
