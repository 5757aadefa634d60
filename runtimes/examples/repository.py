"""Write the example model repository: ``DIR/<model>/<version>/<file>`` plus golden samples."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from runtimes.examples.classifier import write_classifier
from runtimes.examples.digits import REFERENCE_FILE, write_digits
from runtimes.examples.onnx_models import cnn_onnx, mlp_onnx
from runtimes.examples.reference import cnn_forward, mlp_forward
from runtimes.examples.tflite_models import mlp_tflite
from runtimes.examples.tiny_lm import LmSize, write_tiny_lm
from runtimes.examples.weights import MLP_SIZES, SEED, Dense, cnn_layers, mlp_layers
from runtimes.golden import GOLDEN_FILE, GoldenSample

EXAMPLE_MODELS = ("mlp", "cnn", "cnn_ir", "mlp_tflite", "classifier", "digits", "tiny-lm")
VERSION = "1"
MLP_GOLDEN_ROWS = 8
MLP_REFERENCE_ROWS = 64
# The CNN is 50+ layers deep; float32 backends drift further from the float64 reference.
MLP_TOLERANCE = (1e-4, 1e-4)
CNN_TOLERANCE = (1e-3, 1e-3)


def _golden_inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED + 7)
    mlp_x = rng.standard_normal((MLP_GOLDEN_ROWS, MLP_SIZES[0])).astype(np.float32)
    # Noise and a smooth pattern: an untrained net answers noise images almost alike, and
    # rows must differ clearly for a test to notice answers given to the wrong request.
    noise = rng.uniform(-1.0, 1.0, (1, 3, 224, 224))
    yy, xx = np.mgrid[0:224, 0:224] / 224.0
    pattern = 2.0 * np.stack([np.sin(8 * xx), np.cos(6 * yy), xx - yy])[None]
    cnn_x = np.concatenate([noise, pattern]).astype(np.float32)
    return mlp_x, cnn_x


def _write_mlp_reference(path: Path, layers: list[Dense]) -> None:
    """Random rows with their float64-reference outputs: no labels, so quality is agreement."""
    x = np.random.default_rng(SEED + 8).standard_normal((MLP_REFERENCE_ROWS, MLP_SIZES[0]))
    x = x.astype(np.float32)
    expected = mlp_forward(x, layers).astype(np.float32)
    np.savez(path, **{"input:input": x, "output:logits": expected})  # type: ignore[arg-type]


def _config(description: str) -> str:
    return f'# edgefleet model configuration\ndescription = "{description}"\n'


def write_example_repository(
    root: Path,
    *,
    models: tuple[str, ...] = EXAMPLE_MODELS,
    overwrite: bool = False,
    lm_size: LmSize = LmSize.TINY,
    log: Callable[[str], None] = lambda _: None,
) -> list[str]:
    """Write the example models under ``root``; return the names written.

    ``tiny-lm`` (a generative model, :mod:`runtimes.examples.tiny_lm`) is written at
    ``lm_size``; it needs the ``tokenizers`` package and is skipped (and logged) without it.
    ``cnn_ir`` needs OpenVINO for the conversion and is skipped (and logged) without it.
    Each model is written to a scratch directory and renamed into place, so an interrupted
    run never leaves half a model behind.
    """
    unknown = set(models) - set(EXAMPLE_MODELS)
    if unknown:
        raise ValueError(f"unknown example models {sorted(unknown)}; known: {EXAMPLE_MODELS}")
    root.mkdir(parents=True, exist_ok=True)
    _check_targets(root, models, overwrite)

    mlp_x, cnn_x = _golden_inputs()
    mlp = mlp_layers()
    mlp_golden = GoldenSample(
        {"input": mlp_x}, {"logits": mlp_forward(mlp_x, mlp).astype(np.float32)}, *MLP_TOLERANCE
    )
    cnn_golden: GoldenSample | None = None
    written = []
    for name in models:
        with tempfile.TemporaryDirectory(dir=root, prefix=f".{name}-") as scratch:
            version_dir = Path(scratch) / VERSION
            version_dir.mkdir()
            if name == "mlp":
                onnx.save(mlp_onnx(mlp), version_dir / "model.onnx")
                mlp_golden.save(version_dir / GOLDEN_FILE)
                _write_mlp_reference(version_dir / REFERENCE_FILE, mlp)
                description = "MLP 256-1024-1024-10 (Gemm+Relu)"
            elif name == "mlp_tflite":
                (version_dir / "model.tflite").write_bytes(mlp_tflite(mlp))
                mlp_golden.save(version_dir / GOLDEN_FILE)
                description = "MLP 256-1024-1024-10 as a TFLite flatbuffer"
            elif name == "digits":
                try:
                    accuracy = write_digits(version_dir)
                except ImportError:
                    log("skipped digits: scikit-learn is not installed (pip install scikit-learn)")
                    continue
                description = f"MLP 64-64-10 trained on sklearn digits ({accuracy:.1%} held out)"
            elif name == "tiny-lm":
                if (written_lm := _tiny_lm(version_dir, lm_size, log)) is None:
                    continue
                description = written_lm
            elif name == "classifier":
                write_classifier(version_dir)
                description = "JPEG -> top-5 labels: decode, resize, normalise, cnn, softmax"
            else:
                convs, head = cnn_layers()
                if cnn_golden is None:
                    expected = cnn_forward(cnn_x, convs, head).astype(np.float32)
                    cnn_golden = GoldenSample(
                        {"input": cnn_x}, {"logits": expected}, *CNN_TOLERANCE
                    )
                onnx_path = version_dir / "model.onnx"
                onnx.save(cnn_onnx(convs, head), onnx_path)
                if name == "cnn_ir":
                    if not _convert_to_ir(onnx_path, version_dir / "model.xml", log):
                        continue
                    onnx_path.unlink()
                cnn_golden.save(version_dir / GOLDEN_FILE)
                description = "MobileNetV2-like CNN, 3x224x224 -> 1000"
            (Path(scratch) / "config.toml").write_text(_config(description))
            target = root / name
            if target.exists():
                shutil.rmtree(target)
            Path(scratch).rename(target)
            # TemporaryDirectory's cleanup tolerates the directory having moved away.
        written.append(name)
        log(f"wrote {root / name}")
    return written


def _check_targets(root: Path, models: tuple[str, ...], overwrite: bool) -> None:
    for name in models:
        if (root / name).exists() and not overwrite:
            raise FileExistsError(f"{root / name} exists; replace it with --force (overwrite=True)")


def _tiny_lm(version_dir: Path, size: LmSize, log: Callable[[str], None]) -> str | None:
    try:
        return write_tiny_lm(version_dir, size)
    except ImportError:
        log("skipped tiny-lm: tokenizers is not installed (pip install 'edgefleet[generative]')")
        return None


def _convert_to_ir(onnx_path: Path, xml_path: Path, log: Callable[[str], None]) -> bool:
    try:
        import openvino as ov
    except ImportError:
        log("skipped cnn_ir: OpenVINO is not installed (pip install 'edgefleet[openvino]')")
        return False
    ov_model = ov.convert_model(str(onnx_path))
    ov.save_model(ov_model, str(xml_path), compress_to_fp16=False)
    return True
