"""A trained example: scikit-learn's handwritten digits (8x8, 1,797 images) classified by a small
MLP, so that accuracy and agreement on its reference set are real numbers, not noise on random
weights.

The data set ships inside scikit-learn (``load_digits`` reads no network); the training is plain
numpy: full-batch Adam on a 64-64-10 ReLU network with a fixed seed, about a second, identical
bytes on every run. The held-out fifth of the images, with labels and the FP32 logits, is the
version's ``reference.npz`` (``input:<name>``, ``labels``, ``output:<name>``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtimes.examples.onnx_models import mlp_onnx
from runtimes.examples.reference import mlp_forward
from runtimes.examples.weights import SEED, Dense
from runtimes.golden import GOLDEN_FILE, GoldenSample

REFERENCE_FILE = "reference.npz"
HIDDEN = 64
STEPS = 300
LEARNING_RATE = 0.01
HELD_OUT_FRACTION = 0.2
GOLDEN_ROWS = 8


def digits_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train_x, train_y, held_out_x, held_out_y); pixels scaled to [0, 1], float32.

    Raises:
        ImportError: scikit-learn is not installed (it ships the data set).
    """
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(SEED).permutation(len(x))
    cut = int(len(x) * (1 - HELD_OUT_FRACTION))
    train, held = order[:cut], order[cut:]
    return x[train], y[train].astype(np.int64), x[held], y[held].astype(np.int64)


def train_digits(x: np.ndarray, y: np.ndarray) -> list[Dense]:
    """Full-batch Adam on softmax cross-entropy; deterministic (fixed seed, float64 maths)."""
    rng = np.random.default_rng(SEED + 64)
    sizes = [x.shape[1], HIDDEN, 10]
    params = []
    for fan_in, fan_out in zip(sizes, sizes[1:], strict=False):
        params += [rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)]
        params += [np.zeros(fan_out)]
    moments = [np.zeros_like(p) for p in params]
    squares = [np.zeros_like(p) for p in params]
    onehot = np.eye(10)[y]
    xs = x.astype(np.float64)
    for step in range(1, STEPS + 1):
        w1, b1, w2, b2 = params
        hidden = np.maximum(xs @ w1 + b1, 0.0)
        logits = hidden @ w2 + b2
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        d_logits = (p - onehot) / len(xs)
        d_hidden = (d_logits @ w2.T) * (hidden > 0)
        grads = [xs.T @ d_hidden, d_hidden.sum(0), hidden.T @ d_logits, d_logits.sum(0)]
        for i, g in enumerate(grads):
            moments[i] = 0.9 * moments[i] + 0.1 * g
            squares[i] = 0.999 * squares[i] + 0.001 * g * g
            m_hat = moments[i] / (1 - 0.9**step)
            v_hat = squares[i] / (1 - 0.999**step)
            params[i] = params[i] - LEARNING_RATE * m_hat / (np.sqrt(v_hat) + 1e-8)
    w1, b1, w2, b2 = params
    # Dense holds [out, in] weights, as Gemm with transB=1 reads them
    return [
        Dense(np.ascontiguousarray(w1.T, np.float32), b1.astype(np.float32), relu=True),
        Dense(np.ascontiguousarray(w2.T, np.float32), b2.astype(np.float32), relu=False),
    ]


def write_digits(version_dir: Path) -> float:
    """Write model.onnx, golden.npz and reference.npz; return the held-out accuracy."""
    import onnx

    train_x, train_y, held_x, held_y = digits_data()
    layers = train_digits(train_x, train_y)
    onnx.save(mlp_onnx(layers), version_dir / "model.onnx")
    logits = mlp_forward(held_x, layers).astype(np.float32)
    GoldenSample(
        {"input": held_x[:GOLDEN_ROWS]}, {"logits": logits[:GOLDEN_ROWS]}, 1e-4, 1e-4
    ).save(version_dir / GOLDEN_FILE)
    arrays = {"input:input": held_x, "labels": held_y, "output:logits": logits}
    np.savez(version_dir / REFERENCE_FILE, **arrays)  # type: ignore[arg-type]
    return float(np.mean(np.argmax(logits, axis=1) == held_y))
