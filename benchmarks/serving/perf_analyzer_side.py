"""Triton's perf_analyzer beside the project's own gRPC load generator, on one agent, in one
run: the same model, transport, concurrency and duration, the two clients alternating, so a
Triton user can read the agent's figures in the tool they know and compare them with ours.

    python -m benchmarks.serving.perf_analyzer_side --repeat 2

Needs perf_analyzer in .tools/perf_analyzer (``python3 -m benchmarks.perf_analyzer
.tools/perf_analyzer``). Prints a Markdown table of requests/s and p50/p99 per client.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.serving.serving import agent_process, free_port

ROOT = Path(__file__).resolve().parents[2]
PERF_ANALYZER = ROOT / ".tools" / "perf_analyzer" / "perf_analyzer"
CELLS = [
    ("mlp", 1, False),
    ("mlp", 1, True),
    ("mlp", 8, False),
    ("cnn", 8, True),
]
"""(model, concurrent clients, tensors in system shared memory)."""


def ours(target: str, model: str, clients: int, shm: bool, duration_s: float) -> dict[str, float]:
    command = [sys.executable, "-m", "benchmarks.serving.grpc_loadgen", "--target", target]
    command += ["--model", model, "-c", str(clients), "-d", str(duration_s)]
    if shm:
        command += ["--shm", "--output-bytes", "4096"]
    result = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    return {
        "requests_per_s": result["requests_per_s"],
        "p50_ms": result["p50_s"] * 1000,
        "p99_ms": result["p99_s"] * 1000,
    }


def theirs(target: str, model: str, clients: int, shm: bool, duration_s: float) -> dict[str, float]:
    command = [str(PERF_ANALYZER), "-m", model, "-i", "grpc", "-u", target]
    command += ["--concurrency-range", str(clients), "--percentile", "99", "-s", "999"]
    command += ["--measurement-interval", str(int(duration_s * 1000)), "--max-trials", "3"]
    if shm:
        command += ["--shared-memory", "system", "--output-shared-memory-size", "4096"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout

    def number(pattern: str) -> float:
        found = re.search(pattern, out)
        if found is None:
            raise RuntimeError(f"perf_analyzer printed no {pattern!r}:\n{out}")
        return float(found.group(1))

    return {
        "requests_per_s": number(r"Throughput: ([\d.]+) infer/sec"),
        "p50_ms": number(r"p50 latency: (\d+) usec") / 1000,
        "p99_ms": number(r"p99 latency: (\d+) usec") / 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of each cell (medians)")
    args = parser.parse_args()
    if not PERF_ANALYZER.exists():
        sys.exit("no perf_analyzer: python3 -m benchmarks.perf_analyzer .tools/perf_analyzer")
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        exe = Path(sys.executable).parent / "edgefleet"
        subprocess.run(
            [str(exe), "models", "example", str(repo), "--only", "mlp", "--only", "cnn"],
            check=True,
            capture_output=True,
        )
        rows = []
        grpc_port = free_port()
        with agent_process(repo, free_port(), "--grpc-port", str(grpc_port)):
            grpc_target = f"127.0.0.1:{grpc_port}"
            for model, clients, shm in CELLS:
                runs: dict[str, list[dict[str, float]]] = {"ours": [], "perf_analyzer": []}
                for _ in range(args.repeat):
                    runs["ours"].append(ours(grpc_target, model, clients, shm, args.duration))
                    runs["perf_analyzer"].append(
                        theirs(grpc_target, model, clients, shm, args.duration)
                    )
                rows.append((model, clients, shm, runs))
    print("| model | clients | tensors | client | requests/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|---|")
    for model, clients, shm, runs in rows:
        for client, results in runs.items():
            median = {k: statistics.median(r[k] for r in results) for k in results[0]}
            print(
                f"| {model} | {clients} | {'shm' if shm else 'raw'} | {client} | "
                f"{median['requests_per_s']:.0f} | {median['p50_ms']:.3f} | "
                f"{median['p99_ms']:.3f} |"
            )


if __name__ == "__main__":
    main()
