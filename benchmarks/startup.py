"""Cold against warm start: how much the compiled-model caches save.

Each measurement is a fresh process (OpenVINO and ONNX Runtime keep caches in memory too),
cold with an empty cache directory and warm with one a previous process filled. Cold and
warm runs alternate, and the report gives medians and the warm/cold ratio from the same run::

    python -m benchmarks.startup [--repeat 5] [--models DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runtimes.examples import write_example_repository

CASES = (
    ("openvino", "cnn_ir", "model.xml"),
    ("openvino", "cnn", "model.onnx"),
    ("onnxruntime", "cnn", "model.onnx"),
)

_CHILD = """
import json, sys, time
t0 = time.perf_counter()
from pathlib import Path
from runtimes.backends import open_model
from runtimes.base import Placement
from runtimes.golden import GoldenSample
from runtimes.settings import RuntimeSettings
runtime_name, model_file, cache = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
providers = ("CPUExecutionProvider",) if runtime_name == "onnxruntime" else ()
t1 = time.perf_counter()
rt = open_model(model_file, Placement(runtime=runtime_name, providers=providers),
                RuntimeSettings(cache_dir=cache))
t2 = time.perf_counter()
golden = GoldenSample.load(model_file.parent / "golden.npz")
assert not golden.mismatches(rt.infer(golden.inputs))
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "first_infer_s": t3 - t2}))
"""


def _run_child(runtime: str, model_file: Path, cache: Path) -> dict[str, float]:
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, runtime, str(model_file), str(cache)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_to_first_inference_s"] = time.perf_counter() - started
    return result


def measure(
    models: Path, repeat: int, cases: tuple[tuple[str, str, str], ...] = CASES
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for runtime, model, filename in cases:
        model_file = models / model / "1" / filename
        cold: list[dict[str, float]] = []
        warm: list[dict[str, float]] = []
        with tempfile.TemporaryDirectory() as warm_cache:
            _run_child(runtime, model_file, Path(warm_cache))  # fills the warm cache
            for _ in range(repeat):
                with tempfile.TemporaryDirectory() as empty:
                    cold.append(_run_child(runtime, model_file, Path(empty)))
                warm.append(_run_child(runtime, model_file, Path(warm_cache)))
        row: dict[str, Any] = {"runtime": runtime, "model": model, "repeat": repeat}
        for key in ("load_s", "process_to_first_inference_s"):
            c = statistics.median(r[key] for r in cold)
            w = statistics.median(r[key] for r in warm)
            row[f"cold_{key}"], row[f"warm_{key}"], row[f"warm_over_cold_{key}"] = c, w, w / c
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--models", type=Path, help="example repository (written if absent)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        models = args.models or Path(scratch) / "models"
        if not (models / "cnn_ir").is_dir():
            write_example_repository(models, models=("cnn", "cnn_ir"), overwrite=True)
        rows = measure(models, args.repeat)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        f"{'runtime':<12} {'model':<8} {'cold load':>10} {'warm load':>10} {'ratio':>6} "
        f"{'cold start->1st':>16} {'warm start->1st':>16} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r['runtime']:<12} {r['model']:<8} "
            f"{1000 * r['cold_load_s']:>8.0f}ms {1000 * r['warm_load_s']:>8.0f}ms "
            f"{r['warm_over_cold_load_s']:>6.2f} "
            f"{1000 * r['cold_process_to_first_inference_s']:>14.0f}ms "
            f"{1000 * r['warm_process_to_first_inference_s']:>14.0f}ms "
            f"{r['warm_over_cold_process_to_first_inference_s']:>6.2f}"
        )


if __name__ == "__main__":
    main()
