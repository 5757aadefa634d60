"""Served throughput against the physical limit, side by side in one run.

The agent serves ``--model`` in its own process; the load generator (another process) keeps
``--concurrency`` binary V2 requests of one row in flight; the limit is ONNX Runtime
in-process at its best batch size with the same thread settings. The two are measured
alternately ``--repeat`` times; the report gives medians and their ratio::

    python -m benchmarks.serving.serving --model cnn --concurrency 8 --duration 10 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from agent.inference.versions import open_instances
from common.model_config import ModelConfig
from runtimes.base import Placement, Runtime
from runtimes.examples import write_example_repository
from runtimes.formats import find_model_file
from runtimes.settings import RuntimeSettings

BATCH_SIZES = (1, 2, 4, 8, 16, 32)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def agent_process(repository: Path, port: int, *flags: str) -> Iterator[psutil.Process]:
    """``edgefleet agent`` serving ``repository`` on ``port`` (and ``flags``), once ready."""
    env = {
        **os.environ,
        "EDGEFLEET_AGENT_ACCESS_LOG": "false",
        "EDGEFLEET_AGENT_LOG_LEVEL": "WARNING",
    }
    exe = Path(sys.executable).parent / "edgefleet"
    proc = subprocess.Popen(
        [str(exe), "agent", "--model-repository", str(repository), "--port", str(port), *flags],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the agent did not become ready")
            time.sleep(0.1)
        yield psutil.Process(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def binary_request(x: np.ndarray) -> tuple[bytes, list[str]]:
    raw = x.astype("<f4").tobytes()
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return head + raw, [f"Inference-Header-Content-Length: {len(head)}"]


def load(
    url: str, body: bytes, headers: list[str], concurrency: int, duration_s: float
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(body)
        f.flush()
        args = [
            sys.executable,
            "-m",
            "benchmarks.serving.loadgen",
            "--url",
            url,
            "--body",
            f.name,
            "-c",
            str(concurrency),
            "-d",
            str(duration_s),
        ]
        for h in headers:
            args += ["--header", h]
        out = subprocess.run(
            args, capture_output=True, text=True, check=True, timeout=duration_s + 120
        )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def cpu_sessions(model_file: Path, instances: int) -> list[Runtime]:
    """``instances`` ONNX Runtime sessions of ``model_file`` on the CPU, loaded as the agent
    loads them (the CPU threads split between them, the agent's runtime defaults)."""
    placement = Placement(runtime="onnxruntime", providers=("CPUExecutionProvider",))
    runtimes, _ = open_instances(
        model_file,
        placement,
        RuntimeSettings(),
        ModelConfig(instances=instances),
        os.cpu_count() or 1,
    )
    return runtimes


def raw_throughput(
    model_file: Path, row: np.ndarray, batch: int, duration_s: float, instances: int = 1
) -> float:
    """Rows per second of ONNX Runtime in this process at one batch size: ``instances``
    sessions run side by side (:func:`cpu_sessions`), one thread each calling it."""
    runtimes = cpu_sessions(model_file, instances)
    x = np.repeat(row, batch, axis=0)
    counts = [0] * instances

    def run(k: int, stop_at: float) -> None:
        while time.perf_counter() < stop_at:
            runtimes[k].infer({"input": x})
            counts[k] += batch

    for runtime in runtimes:
        runtime.infer({"input": x})
    started = time.perf_counter()
    with ThreadPoolExecutor(instances) as pool:
        list(pool.map(run, range(instances), [started + duration_s] * instances))
    elapsed = time.perf_counter() - started
    for runtime in runtimes:
        runtime.close()
    return sum(counts) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model-config", default="", help="config.toml text for the served model")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "models"
        write_example_repository(repo, models=(args.model,))
        if args.model_config:
            (repo / args.model / "config.toml").write_text(args.model_config.replace("\\n", "\n"))
        model_file, _ = find_model_file(repo / args.model / "1")
        shape = (1, 3, 224, 224) if args.model == "cnn" else (1, 256)
        row = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        body, headers = binary_request(row)
        # calibrate: the batch size at which raw ONNX Runtime is fastest
        calib = {
            b: raw_throughput(model_file, row, b, max(1.0, args.duration / 4)) for b in BATCH_SIZES
        }
        best = max(calib, key=lambda b: calib[b])
        port = free_port()
        url = f"http://127.0.0.1:{port}/v2/models/{args.model}/infer"
        served, raw, server_cpu, client_cpu, p50, p99 = [], [], [], [], [], []
        with agent_process(repo, port) as server:
            load(url, body, headers, args.concurrency, 2.0)  # warm the connections and the model
            for _ in range(args.repeat):
                raw.append(raw_throughput(model_file, row, best, args.duration))
                cpu0 = server.cpu_times()
                result = load(url, body, headers, args.concurrency, args.duration)
                cpu1 = server.cpu_times()
                if set(result["statuses"]) != {"200"} or result["errors"]:
                    raise RuntimeError(f"the agent answered {result['statuses']}")
                served.append(result["requests_per_s"])
                server_cpu.append(
                    (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / result["wall_s"]
                )
                client_cpu.append(result["client_cpu_s"] / result["wall_s"])
                p50.append(result["p50_s"])
                p99.append(result["p99_s"])
    report = {
        "model": args.model,
        "model_config": args.model_config,
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "raw_best_batch": best,
        "raw_calibration_rows_per_s": calib,
        "raw_rows_per_s": statistics.median(raw),
        "served_rows_per_s": statistics.median(served),
        "ratio_served_over_raw": statistics.median(s / r for s, r in zip(served, raw, strict=True)),
        "served_p50_ms": 1000 * statistics.median(p50),
        "served_p99_ms": 1000 * statistics.median(p99),
        "server_cpu_cores": statistics.median(server_cpu),
        "client_cpu_cores": statistics.median(client_cpu),
        "runs": {"raw": raw, "served": served},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
