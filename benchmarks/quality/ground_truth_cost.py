"""What keeping predictions for ground truth adds to a request, and what joining costs.

In alternating rounds on the same machine: the agent's
:meth:`agent.inference.predictions.PredictionStore.record` of one answered request's output
(``digits``' 10 logits per row, 1 and 32 rows, into a store at its 100,000 bound, so each
record also pushes the oldest out), ONNX Runtime running the same request on the example
model, and :meth:`~agent.inference.predictions.PredictionStore.join` of a post of 1,000
outcomes. Prints one JSON document::

    python -m benchmarks.quality.ground_truth_cost --rounds 5
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

from agent.inference.predictions import GroundTruthSettings, PredictionStore
from common.protocol.ground_truth import GroundTruthTask
from runtimes.examples import write_example_repository

CLASSIFY = GroundTruthTask.CLASSIFICATION
BOUND = 100_000


def _case(session: ort.InferenceSession, rows: np.ndarray, rounds: int) -> dict[str, Any]:
    name = session.get_inputs()[0].name
    store = PredictionStore(GroundTruthSettings(max_predictions=BOUND))
    logits = session.run(None, {name: rows})[0]
    for i in range(BOUND):  # full: every record below also evicts one
        store.record(f"warm-{i}", "digits", 1, CLASSIFY, logits)
    record_us, infer_us, join_ms = [], [], []
    n = 2000
    for r in range(rounds):
        started = time.perf_counter()
        for i in range(n):
            store.record(f"r{r}-{i}", "digits", 1, CLASSIFY, logits)
        record_us.append((time.perf_counter() - started) / n * 1e6)
        started = time.perf_counter()
        for _ in range(200):
            session.run(None, {name: rows})
        infer_us.append((time.perf_counter() - started) / 200 * 1e6)
        labels = [0.0] * len(rows)
        post = [(f"r{r}-{i}", labels) for i in range(1000)]
        started = time.perf_counter()
        store.join("digits", post)
        join_ms.append((time.perf_counter() - started) * 1e3)
    return {
        "rows": len(rows),
        "record_us": round(statistics.median(record_us), 2),
        "onnxruntime_us": round(statistics.median(infer_us), 2),
        "ratio": round(statistics.median(record_us) / statistics.median(infer_us), 3),
        "join_1000_outcomes_ms": round(statistics.median(join_ms), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        write_example_repository(Path(root), models=("digits",))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        model = str(Path(root) / "digits" / "1" / "model.onnx")
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        x = np.random.default_rng(0).uniform(0, 16, (32, 64)).astype(np.float32)
        cases = [_case(session, x[:n], args.rounds) for n in (1, 32)]
    print(json.dumps({"cases": cases}, indent=2))


if __name__ == "__main__":
    main()
