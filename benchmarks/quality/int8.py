"""INT8 against FP32, served side by side by the agent, and INT8's accuracy on a trained model.

Speed: the example ``cnn`` and its INT8 variant, built by the control plane's own builder
(:func:`control_plane.quality.optimise.build_int8`, calibrated on 16 images), are served by two
agents started from the same configuration (the serving suite's ``AGENT_CONFIG``); closed-loop
load at ``--concurrency`` with binary bodies alternates between them for ``--pairs`` rounds, so
both see the same machine. Goal: INT8 rows/s >= 1.8 x FP32's.

Accuracy: the trained ``digits`` example, FP32 and INT8 (calibrated on its reference set), on
its 360 held-out digits (and the NNCF OpenVINO INT8 variant beside it, where nncf is
installed). Goal: INT8 moves accuracy by at most 1 point. Prints one JSON document::

    python -m benchmarks.quality.int8 --concurrency 8 --pairs 3 --duration 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.serving.bodies import make_bodies
from benchmarks.serving.suite import AGENT_CONFIG, measure
from benchmarks.serving.systems import Running, agent
from control_plane.quality.optimise import (
    VariantKind,
    build_int8,
    build_openvino_int8,
    judge,
    missing_tool,
    run_model,
)
from control_plane.quality.reference import ReferenceSet, load_reference
from runtimes.examples import write_example_repository

SPEEDUP_GOAL = 1.8
ACCURACY_GOAL_POINTS = 1.0


def _cnn_calibration(rows: int = 16) -> ReferenceSet:
    """Images of noise and smooth patterns, as the cnn's golden input is made."""
    rng = np.random.default_rng(11)
    yy, xx = np.mgrid[0:224, 0:224] / 224.0
    images = []
    for i in range(rows):
        if i % 2:
            images.append(rng.uniform(-1.0, 1.0, (3, 224, 224)))
        else:
            f = rng.uniform(2, 10, 3)
            images.append(2.0 * np.stack([np.sin(f[0] * xx), np.cos(f[1] * yy), f[2] * (xx - yy)]))
    x = np.stack(images).astype(np.float32)
    return ReferenceSet({"input": x}, None, {"logits": np.zeros((rows, 1000), np.float32)})


def accuracy(root: Path) -> dict[str, Any]:
    version = root / "digits/1"
    reference = load_reference(version / "reference.npz")
    build_int8(version / "model.onnx", root / "digits-int8.onnx", reference)
    fp32 = run_model(version / "model.onnx", reference)
    numbers = judge(fp32, run_model(root / "digits-int8.onnx", reference), reference.labels)
    numbers["delta_points"] = 100 * numbers["accuracy_delta"]
    numbers["goal_met"] = abs(numbers["delta_points"]) <= ACCURACY_GOAL_POINTS
    if missing_tool(VariantKind.OPENVINO_INT8) is None:  # the IR variant, for comparison
        with contextlib.redirect_stdout(sys.stderr):  # NNCF's progress bars: stdout is JSON
            build_openvino_int8(version / "model.onnx", root / "digits-ov.xml", reference)
        ov = judge(fp32, run_model(root / "digits-ov.xml", reference), reference.labels)
        numbers["openvino_int8_delta_points"] = 100 * ov["accuracy_delta"]
    return numbers


def speed(root: Path, concurrency: int, pairs: int, duration_s: float) -> dict[str, Any]:
    fp32_repo, int8_repo = root / "fp32", root / "int8"
    write_example_repository(fp32_repo, models=("cnn",))
    (int8_repo / "cnn/1").mkdir(parents=True)
    reference = _cnn_calibration()
    build_int8(fp32_repo / "cnn/1/model.onnx", int8_repo / "cnn/1/model.onnx", reference)
    agreement = judge(
        run_model(fp32_repo / "cnn/1/model.onnx", reference),
        run_model(int8_repo / "cnn/1/model.onnx", reference),
        None,
    )
    bodies = make_bodies("cnn")
    runs: dict[str, list[float]] = {"fp32": [], "int8": []}
    logs = root / "logs"
    logs.mkdir()
    with ExitStack() as stack:
        servers: dict[str, Running] = {}
        for name, repo in (("fp32", fp32_repo), ("int8", int8_repo)):
            servers[name] = stack.enter_context(
                agent(repo, "cnn", bodies.json[0], logs, config=AGENT_CONFIG["cnn"], name=name)
            )
            measure(servers[name], "cnn", bodies, "binary", concurrency, 2.0)  # warm-up
        for i in range(pairs):
            order = ["fp32", "int8"] if i % 2 == 0 else ["int8", "fp32"]
            for name in order:
                run = measure(servers[name], "cnn", bodies, "binary", concurrency, duration_s)
                runs[name].append(run["requests_per_s"])
    ratios = [b / a for a, b in zip(runs["fp32"], runs["int8"], strict=True)]
    return {
        "rows_per_s": runs,
        "ratios": ratios,
        "median_ratio": statistics.median(ratios),
        "goal_met": statistics.median(ratios) >= SPEEDUP_GOAL,
        "int8_top1_agreement_random_weights": agreement["agreement"],
        "int8_max_abs_diff": agreement["max_abs_diff"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgefleet-int8-") as scratch:
        root = Path(scratch)
        write_example_repository(root, models=("digits",))
        doc = {
            "accuracy": accuracy(root),
            "speed": speed(root, args.concurrency, args.pairs, args.duration),
        }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
