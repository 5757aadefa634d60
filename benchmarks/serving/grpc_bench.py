"""Local apps' transports side by side in one run: the agent over REST (binary), gRPC on TCP and
on a Unix socket, gRPC with system shared memory, MLServer's gRPC, and raw ONNX Runtime in this
process, on the same model files and rows; then issue 37's goals, met or missed::

    python -m benchmarks.serving.grpc_bench --duration 3 --repeat 2 --json grpc-bench.json

Each cell is a closed loop from its own process (:mod:`benchmarks.serving.loadgen` for REST,
:mod:`benchmarks.serving.grpc_loadgen` for gRPC). The agent serves each model with the suite's
configuration (:data:`benchmarks.serving.suite.AGENT_CONFIG`). MLServer is left out, and said
so, when its virtual environment cannot be made.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.serving.bodies import make_bodies
from benchmarks.serving.serving import load, raw_throughput
from benchmarks.serving.suite import AGENT_CONFIG
from benchmarks.serving.systems import Running, agent, free_port, mlserver
from runtimes.examples import write_example_repository
from runtimes.formats import find_model_file

CONCURRENCY = {"mlp": (1, 8, 32), "cnn": (1, 8)}
OUTPUT_BYTES = {"mlp": 10 * 4, "cnn": 1000 * 4}
RAW_BATCHES = (1, 2, 4, 8)
RAW_INSTANCES = (1, 2)


def grpc_load(target: str, model: str, concurrency: int, duration_s: float, *flags: str) -> Any:
    args = [
        sys.executable,
        "-m",
        "benchmarks.serving.grpc_loadgen",
        "--target",
        target,
        "--model",
        model,
        "-c",
        str(concurrency),
        "-d",
        str(duration_s),
        "--output-bytes",
        str(OUTPUT_BYTES[model]),
        *flags,
    ]
    out = subprocess.run(args, capture_output=True, text=True, timeout=duration_s + 120)
    if out.returncode != 0:
        raise RuntimeError(f"grpc_loadgen failed: {out.stderr[-2000:]}")
    result = json.loads(out.stdout)
    if result["errors"]:
        raise RuntimeError(f"grpc_loadgen: {result['errors']}")
    return result


def _config(key: str) -> tuple[int, int]:
    """(batch, sessions) of a raw calibration key, ``b<batch>x<sessions>``."""
    batch, sessions = key[1:].split("x")
    return int(batch), int(sessions)


def cell(result: dict[str, Any]) -> dict[str, float]:
    return {
        "rows_per_s": round(result["requests_per_s"], 1),
        "p50_ms": round(1000 * result["p50_s"], 3),
        "p99_ms": round(1000 * result["p99_s"], 3),
        # the load generator shares the 2 cores: what each request cost it, in microseconds
        "client_cpu_us": round(1e6 * result["client_cpu_s"] / max(1, result["requests"]), 1),
    }


def bench_model(
    model: str, repo: Path, work: Path, duration_s: float, with_mlserver: bool, repeat: int
) -> dict[str, Any]:
    """Every cell of ``model``, medians of ``repeat`` runs."""
    bodies = make_bodies(model)
    model_file, _ = find_model_file(repo / model / "1")
    cells: dict[str, dict[str, Any]] = {}
    raw = {
        f"b{b}x{n}": round(raw_throughput(model_file, bodies.row, b, duration_s / 2, n), 1)
        for n in RAW_INSTANCES
        for b in RAW_BATCHES
    }
    uds = Path(tempfile.mkdtemp(dir="/tmp")) / "agent.sock"
    grpc_port = free_port()
    env = {
        "EDGEFLEET_AGENT_GRPC__ENABLED": "true",
        "EDGEFLEET_AGENT_GRPC__PORT": str(grpc_port),
        "EDGEFLEET_AGENT_GRPC__UDS": str(uds),
    }
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    served = work / f"repo-{model}"
    write_example_repository(served, models=(model,))
    with ExitStack() as stack:
        running: Running = stack.enter_context(
            agent(served, model, bodies.json[0], logs, config=AGENT_CONFIG.get(model, ""), env=env)
        )
        peer: Running | None = None
        if with_mlserver:
            try:
                peer = stack.enter_context(mlserver(model_file, model, bodies.json[0], logs, work))
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                cells["mlserver-grpc"] = {"missing": str(exc)[:300]}
        tcp = f"127.0.0.1:{grpc_port}"
        grpc_load(tcp, model, 8, 1.0)  # warm the connections and the model
        best = max(raw, key=lambda k: raw[k])
        mlserver_target = ""
        if peer is not None:
            mlserver_settings = json.loads((work / "mlserver" / "settings.json").read_text())
            mlserver_target = f"127.0.0.1:{mlserver_settings['grpc_port']}"
        kinds = ["rest-binary", "grpc-tcp", "grpc-uds", "grpc-uds-shm"]
        kinds += ["mlserver-grpc"] if mlserver_target else []

        def measure(kind: str, c: int) -> Any:
            if kind == "rest-binary":
                return load(running.infer_url(model), *bodies.binary, c, duration_s)
            target = {
                "grpc-tcp": tcp,
                "grpc-uds": f"unix:{uds}",
                "grpc-uds-shm": f"unix:{uds}",
                "mlserver-grpc": mlserver_target,
            }[kind]
            return grpc_load(target, model, c, duration_s, *(["--shm"] if "shm" in kind else []))

        # configurations of raw ONNX Runtime to take the best of: the calibrated one and the
        # two that won on 2 cores in quiet runs (2 single-threaded sessions, batch 1 or 2)
        best_configs = sorted({_config(best), (1, 2), (2, 2)})

        def reference(c: int) -> float:
            configs = [(1, 1)] if c == 1 else best_configs
            share = duration_s / 2 / len(configs)
            return max(raw_throughput(model_file, bodies.row, b, share, n) for b, n in configs)

        runs: dict[str, list[dict[str, float]]] = {}
        for repetition in range(repeat):
            for c in CONCURRENCY[model]:
                # raw ONNX Runtime between every two cells, at batch 1 for one client and at
                # its best otherwise: each cell is compared with the mean of the runs around it;
                # the order of the systems turns with each repetition
                before = reference(c)
                for kind in kinds[repetition % len(kinds) :] + kinds[: repetition % len(kinds)]:
                    measured = cell(measure(kind, c))
                    after = reference(c)
                    around = (before + after) / 2
                    measured["raw_rows_per_s"] = round(around, 1)
                    measured["x_raw"] = round(measured["rows_per_s"] / around, 3)
                    runs.setdefault(f"{kind} c{c}", []).append(measured)
                    before = after
        for name, measured_runs in runs.items():
            cells[name] = {
                key: round(statistics.median(r[key] for r in measured_runs), 3)
                for key in measured_runs[0]
            }
    return {"raw_rows_per_s": raw, "cells": cells}


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 37's goals, each with the figures it compares."""
    out = []
    cnn, mlp = results.get("cnn"), results.get("mlp")
    if cnn is not None:
        shm1 = cnn["cells"]["grpc-uds-shm c1"]["x_raw"]
        out.append(_goal("cnn 1 client, gRPC + shm >= 0.9 x raw batch 1", shm1, 0.9, ">="))
        at8 = max(cnn["cells"][f"{k} c8"]["x_raw"] for k in ("grpc-uds-shm", "grpc-tcp"))
        out.append(_goal("cnn 8 clients (best gRPC) >= 0.95 x raw best", at8, 0.95, ">="))
    if mlp is not None:
        peer = mlp["cells"].get("mlserver-grpc c32", {})
        if "rows_per_s" in peer:
            ours = mlp["cells"]["grpc-tcp c32"]["rows_per_s"]
            ratio = ours / peer["rows_per_s"]
            out.append(_goal("mlp 32 clients gRPC >= 3 x MLServer gRPC", ratio, 3, ">="))
        else:
            out.append({"goal": "mlp 32 clients gRPC >= 3 x MLServer gRPC", "met": None})
        uds = mlp["cells"]["grpc-uds c1"]["p50_ms"]
        rest = mlp["cells"]["rest-binary c1"]["p50_ms"]
        out.append(_goal("mlp 1 client p50, gRPC UDS <= 0.6 x REST", uds / rest, 0.6, "<="))
    return out


def _goal(name: str, ratio: float, bound: float, op: str) -> dict[str, Any]:
    met = ratio >= bound if op == ">=" else ratio <= bound
    return {"goal": name, "ratio": round(ratio, 3), "met": met}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each cell (medians)")
    parser.add_argument("--no-mlserver", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "duration_s": args.duration,
        "repeat": args.repeat,
        # the machine is shared: its load when the run started and ended says how to read it
        "load_average_start": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        repo = work / "models"
        write_example_repository(repo, models=tuple(args.models))
        for model in args.models:
            results[model] = bench_model(
                model, repo, work / model, args.duration, not args.no_mlserver, args.repeat
            )
    results["load_average_end"] = os.getloadavg()
    results["goals"] = goals(results)
    text = json.dumps(results, indent=2)
    if args.json is not None:
        args.json.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
