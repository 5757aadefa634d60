"""What reading shared memory with ``pread`` instead of through a mapping costs, side by side.

The agent used to give the runtime a numpy view of the mapped object (no copy); it now copies
each input out with ``pread`` and writes each output with ``pwrite`` (agent/shm/regions.py),
so that an object its owner truncates cannot kill the agent with SIGBUS. This runs the example
models in ONNX Runtime in-process with the input taken each way from one real ``/dev/shm``
object and the output written back each way, in interleaved rounds, and prints rows/s of both
and their ratio at each batch size.

    python -m benchmarks.serving.shm_copy --models mlp cnn --batch 1 32 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import onnxruntime as ort

from agent.shm.regions import Region


def _session(repo: Path, model: str) -> tuple[ort.InferenceSession, str, list[int]]:
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"))
    first = session.get_inputs()[0]
    return session, first.name, [d if isinstance(d, int) else 1 for d in first.shape[1:]]


def _rate(step: Callable[[], None], rows: int, seconds: float) -> float:
    step()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        done += rows
    return done / (time.perf_counter() - start)


def bench(model: str, batch: int, rounds: int, seconds: float, repo: Path) -> dict[str, object]:
    session, name, row_shape = _session(repo, model)
    x = np.random.default_rng(0).standard_normal((batch, *row_shape)).astype(np.float32)
    out_bytes = session.run(None, {name: x})[0].nbytes
    segment = shared_memory.SharedMemory(f"ef-bench-{uuid.uuid4().hex[:8]}", True, x.nbytes * 2)
    fd = os.open(f"/dev/shm/{segment.name}", os.O_RDWR)
    mapped = mmap.mmap(fd, x.nbytes * 2, mmap.MAP_SHARED)
    region = Region("r", segment.name, 0, x.nbytes + out_bytes, os.dup(fd))
    assert segment.buf is not None
    segment.buf[: x.nbytes] = x.tobytes()
    reads = 200
    start = time.perf_counter()
    for _ in range(reads):
        region.read(0, x.nbytes, "in")
    copy_us = (time.perf_counter() - start) / reads * 1e6

    def mapped_path() -> None:  # the old path: a view in, np.copyto out
        view = np.frombuffer(mapped, np.float32, x.size).reshape(x.shape)
        out = session.run(None, {name: view})[0]
        target = np.frombuffer(mapped, out.dtype, out.size, offset=x.nbytes).reshape(out.shape)
        np.copyto(target, out)

    def pread_path() -> None:  # the agent's path now
        data = region.read(0, x.nbytes, "in")
        out = session.run(None, {name: np.frombuffer(data, np.float32).reshape(x.shape)})[0]
        region.write(x.nbytes, np.ascontiguousarray(out).data, "out")

    mapped_rates, pread_rates = [], []
    for _ in range(rounds):  # interleaved: the host's load falls on both alike
        mapped_rates.append(_rate(mapped_path, batch, seconds))
        pread_rates.append(_rate(pread_path, batch, seconds))
    mapped.close()
    os.close(fd)
    segment.close()
    segment.unlink()
    m, p = statistics.median(mapped_rates), statistics.median(pread_rates)
    ratios = [b / a for a, b in zip(mapped_rates, pread_rates, strict=True)]
    return {
        "model": model,
        "batch": batch,
        "input_bytes": x.nbytes,
        "pread_us": round(copy_us, 1),
        "mapped_rows_s": round(m, 1),
        "pread_rows_s": round(p, 1),
        "pread_over_mapped": round(statistics.median(ratios), 3),
        "ratios": [round(r, 3) for r in ratios],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="per path and round")
    args = parser.parse_args()
    from runtimes.examples.repository import write_example_repository

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        write_example_repository(repo)
        for model in args.models:
            for batch in args.batch:
                print(json.dumps(bench(model, batch, args.rounds, args.seconds, repo)))


if __name__ == "__main__":
    main()
