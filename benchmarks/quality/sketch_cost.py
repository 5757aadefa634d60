"""What sketching served inputs and outputs (drift) adds to a request, against the inference
it rides on.

For each case, in alternating rounds on the same machine: the agent's
:meth:`agent.inference.sketches.InputSketchBook.observe` of one request's decoded inputs and
its outputs (a
window of ``--requests`` requests, so both the kept requests and, past the budget of 512
rows, the sampled-out ones are in the mean), and ONNX Runtime running the same request on the
example model. Also the cost of taking a window (binning, off the request path) and the size
of its sketch as JSON. Prints one JSON document::

    python -m benchmarks.quality.sketch_cost --rounds 5 --requests 2000
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from agent.inference.sketches import InputSketchBook, InputSketchSettings
from runtimes.examples import write_example_repository


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _case(model: Path, rows: np.ndarray, rounds: int, requests: int) -> dict[str, Any]:
    session = _session(model)
    name = session.get_inputs()[0].name
    book = InputSketchBook(InputSketchSettings())
    # the outputs too, as the agent sketches them (output drift)
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, {name: rows}), strict=True))
    observe_us, infer_us, take_ms = [], [], []
    size = 0
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(requests):
            book.observe("m", 1, {name: rows}, outputs)
        observe_us.append((time.perf_counter() - start) / requests * 1e6)
        start = time.perf_counter()
        taken = book.take_all()[("m", 1)]
        take_ms.append((time.perf_counter() - start) * 1e3)
        size = sum(len(s.model_dump_json()) for s in (*taken.inputs, *taken.outputs, *taken.top1))
        start = time.perf_counter()
        for _ in range(requests):
            session.run(None, {name: rows})
        infer_us.append((time.perf_counter() - start) / requests * 1e6)
    observe, infer = statistics.median(observe_us), statistics.median(infer_us)
    return {
        "shape": list(rows.shape),
        "observe_us_per_request": round(observe, 2),
        "onnxruntime_us_per_request": round(infer, 2),
        "observe_over_infer": round(observe / infer, 4),
        "take_window_ms": round(statistics.median(take_ms), 2),
        "sketch_json_bytes": size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_example_repository(root, models=("digits", "cnn"))
        with np.load(root / "digits/1/reference.npz") as data:
            digits = data["input:input"].astype(np.float32)
        cnn = _session(root / "cnn/1/model.onnx").get_inputs()[0]
        image_shape = [1, *[d if isinstance(d, int) else 1 for d in cnn.shape[1:]]]
        report = {
            "digits, 1 row": _case(root / "digits/1/model.onnx", digits[:1], **vars(args)),
            "digits, 32 rows": _case(root / "digits/1/model.onnx", digits[:32], **vars(args)),
            "cnn, 1 image": _case(
                root / "cnn/1/model.onnx",
                rng.random(image_shape, dtype=np.float32),
                **vars(args),
            ),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
