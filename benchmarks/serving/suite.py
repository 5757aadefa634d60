"""The serving comparison: every system, model, body kind and concurrency, side by side in one run.

For each model all systems are started once and kept running; each repetition then walks the
matrix of (concurrency, system, body) cells in an order rotated by the repetition, so no system
is always measured first or last, and measures raw ONNX Runtime in this process at its best batch
size and number of sessions between them. Medians of the repetitions are reported, and every
comparison is a ratio of figures measured in the same run::

    python -m benchmarks.serving.suite --models mlp cnn --concurrency 1 8 32 128 --duration 5 \\
        --repeat 3 --json bench-serving.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.serving.bodies import Bodies, make_bodies
from benchmarks.serving.serving import BATCH_SIZES, raw_throughput
from benchmarks.serving.systems import Running, agent, fastapi_endpoint, lean_server, mlserver
from common.model_config import ModelConfig
from runtimes.examples import write_example_repository
from runtimes.formats import find_model_file

AGENT_CONFIG = {"cnn": "instances = 2\n[batching]\ntune = true\n"}
"""The agents' model configuration beyond the defaults, by model. ``cnn`` is served as a
throughput deployment would serve it: one single-threaded session per core instead of one
session of two threads (ONNX Runtime's two threads wait on each other inside every operator of
a small batch), and its batch size measured at load (``[batching] tune``): whether two rows
cost less per row than one depends on the CPU. Capped where the gain stops, a batch is full
when formed, and a full batch waits queued behind the running ones, so no session waits for the
event loop between batches; the third session this configuration had before did that job with
open-ended batches. ``python -m benchmarks.serving.ab --model cnn --body binary -c 8 --pairs 4
--raw-instances 2 --raw-batch 2`` on two cores of a Xeon (model 207), 2026-12-05, against raw
ONNX Runtime, medians of four pairs: three batched sessions (the configuration before) 0.827,
0.816 and 0.823 x in three runs, two tuned sessions 0.933 and 0.899 in the first two (tuning
chose no batching both times: 163 rows/s at one row, 156 at two in the second), two sessions
capped at 2 rows 0.901 in the third, two without batching 0.937, 0.888 and 0.893. In two runs
of three pairs in the same hour, three batched sessions 0.883 and 0.874, two without batching
0.910 and 0.870."""
NOBATCH_CONFIG = {"cnn": "instances = 2\n"}
"""The unbatched agent's model configuration, by model. Without batching ``cnn`` runs a session
per core, a request queued behind the running ones keeping each busy (what the third session
did with batching): ``python -m benchmarks.serving.ab --model cnn --body binary -c 8 --pairs 3
--raw-instances 2`` on two cores of a Xeon, 2026-12-05, against raw ONNX Runtime: two sessions
without batching 0.862, 0.893 and 0.885 x, three 0.849, 0.828 and 0.825, three with batching
(``AGENT_CONFIG``) 0.859, 0.830 and 0.842."""
RAW_BRACKETED = frozenset(
    {
        ("cnn", "agent", "binary", 8),
        ("cnn", "agent-nobatch", "binary", 8),
        ("cnn", "lean", "binary", 8),
    }
)
"""(model, system, body, concurrency) of the cells a goal compares with raw ONNX Runtime: raw
is measured right before and right after each of their runs as well, and the goal compares with
the mean of the two. The raw run at the start of a repetition is up to minutes from a cell, and
the machine's speed moves that much: in the run at 99d5024 the three were 201, 167 and 184
rows/s."""
RAW_INSTANCES = (1, 2, 3)
"""Raw ONNX Runtime's limit is the best of these numbers of sessions side by side (one of them
the agent's) at every batch size."""

UNBATCHED = frozenset({"fastapi", "fastapi-async", "lean"})
"""Systems that run one request per ``session.run`` by construction."""

BODY_KINDS = {
    "agent": ("json", "binary"),
    "agent-nobatch": ("json", "binary"),
    "fastapi": ("json",),
    "lean": ("binary",),
    "mlserver": ("json",),
}


@dataclass
class Cell:
    model: str
    system: str
    body: str
    concurrency: int
    runs: list[dict[str, Any]] = field(default_factory=list)

    def median(self, key: str) -> float | None:
        values = [r[key] for r in self.runs if r.get(key) is not None]
        return statistics.median(values) if values else None


def run_load(
    url: str, body: bytes, headers: list[str], concurrency: int, duration_s: float
) -> dict[str, Any]:
    """One closed-loop load in a separate process (benchmarks.serving.loadgen)."""
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(body)
        f.flush()
        args = [sys.executable, "-m", "benchmarks.serving.loadgen", "--url", url, "--body", f.name]
        args += ["-c", str(concurrency), "-d", str(duration_s)]
        for h in headers:
            args += ["--header", h]
        out = subprocess.run(
            args, capture_output=True, text=True, check=True, timeout=duration_s + 300
        )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


class BatchProbe:
    """Rows and batches a server ran, read before and after a measurement."""

    def __init__(self, server: Running, model: str) -> None:
        self.server, self.model = server, model

    def read(self) -> tuple[float, float, dict[str, float]]:
        if self.server.batch_log is not None:  # MLServer: one line per batch
            sizes = [int(x) for x in self.server.batch_log.read_text().split()]
            hist: dict[str, float] = {}
            for size in sizes:
                hist[str(size)] = hist.get(str(size), 0) + 1
            return float(sum(sizes)), float(len(sizes)), hist
        if self.server.name in UNBATCHED:
            return 0.0, 0.0, {}
        import httpx

        text = httpx.get(f"{self.server.base_url}/metrics", timeout=10).text
        rows = batches = 0.0
        hist = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.labels.get("model") != self.model:
                    continue
                if s.name == "edgefleet_inference_rows_total":
                    rows += s.value
                elif s.name == "edgefleet_batch_executions_total":
                    batches += s.value
                elif s.name == "edgefleet_batch_size_rows_bucket":
                    hist[s.labels["le"]] = hist.get(s.labels["le"], 0) + s.value
        return rows, batches, hist


def _batch_delta(
    before: tuple[float, float, dict[str, float]], after: tuple[float, float, dict[str, float]]
) -> tuple[float | None, dict[str, float]]:
    rows, batches = after[0] - before[0], after[1] - before[1]
    hist = {k: v - before[2].get(k, 0) for k, v in after[2].items()}
    return (rows / batches if batches else None), hist


def measure(
    server: Running, model: str, bodies: Bodies, kind: str, concurrency: int, duration_s: float
) -> dict[str, Any]:
    body, headers = bodies.json if kind == "json" else bodies.binary
    probe = BatchProbe(server, model)
    before, cpu0 = probe.read(), server.tree_cpu_s()
    result = run_load(server.infer_url(model), body, headers, concurrency, duration_s)
    cpu1, after = server.tree_cpu_s(), probe.read()
    mean_batch, hist = _batch_delta(before, after)
    if server.name in UNBATCHED:
        mean_batch = 1.0
    ok = result["statuses"].get("200", 0)
    wall = result["wall_s"]
    return {
        "requests_per_s": ok / wall,
        "statuses": result["statuses"],
        "errors": result["errors"],
        "p50_ms": 1000 * result["p50_s"] if result["p50_s"] else None,
        "p95_ms": 1000 * result["p95_s"] if result["p95_s"] else None,
        "p99_ms": 1000 * result["p99_s"] if result["p99_s"] else None,
        "server_cpu_cores": (cpu1 - cpu0) / wall,
        "client_cpu_cores": result["client_cpu_s"] / wall,
        "server_cpu_ms_per_inference": 1000 * (cpu1 - cpu0) / ok if ok else None,
        "mean_batch_rows": mean_batch,
        "batch_histogram": hist,
    }


def overload(
    server: Running, model: str, bodies: Bodies, concurrency: int, duration_s: float
) -> dict[str, Any]:
    """The agent far past capacity: RSS sampled throughout, the excess shed with 503s."""
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            samples.append(server.tree_rss_bytes())

    idle_rss = server.tree_rss_bytes()
    sampler = threading.Thread(target=sample, name="rss-sampler")
    sampler.start()
    try:
        body, headers = bodies.binary
        result = run_load(server.infer_url(model), body, headers, concurrency, duration_s)
    finally:
        stop.set()
        sampler.join()
    after = run_load(server.infer_url(model), body, headers, 1, 2.0)
    return {
        "concurrency": concurrency,
        "duration_s": duration_s,
        "idle_rss_mb": idle_rss / 2**20,
        "max_rss_mb": max(samples, default=idle_rss) / 2**20,
        "rss_samples_mb": [s / 2**20 for s in samples],
        "statuses": result["statuses"],
        "errors": result["errors"],
        "requests_per_s": result["requests_per_s"],
        "p50_ms": 1000 * (result["p50_s"] or 0),
        "p99_ms": 1000 * (result["p99_s"] or 0),
        "after_statuses": after["statuses"],
        "after_p50_ms": 1000 * (after["p50_s"] or 0),
    }


def run_model(
    model: str,
    concurrencies: list[int],
    duration_s: float,
    repeat: int,
    systems: list[str],
    scratch: Path,
    overload_s: float,
) -> dict[str, Any]:
    repos: dict[str, Path] = {}
    for name in ("agent", "agent-nobatch"):
        repos[name] = scratch / name / "models"
        write_example_repository(repos[name], models=(model,))
    model_file, _ = find_model_file(repos["agent"] / model / "1")
    bodies = make_bodies(model)
    logs = scratch / "logs"
    logs.mkdir(exist_ok=True)
    # the physical limit: the best of every batch size and of RAW_INSTANCES sessions side by side
    calib = {
        (k, b): raw_throughput(model_file, bodies.row, b, 1.5, instances=k)
        for k in RAW_INSTANCES
        for b in BATCH_SIZES
    }
    best_instances, best = max(calib, key=lambda kb: calib[kb])
    cells: dict[tuple[str, str, int], Cell] = {}
    raw_runs: list[float] = []
    with ExitStack() as stack:
        servers: dict[str, Running] = {}
        probe = bodies.json[0]
        for name in systems:
            if name == "agent":
                cm = agent(repos["agent"], model, probe, logs, config=AGENT_CONFIG.get(model, ""))
            elif name == "agent-nobatch":
                config = NOBATCH_CONFIG.get(model, AGENT_CONFIG.get(model, ""))
                cm = agent(
                    repos["agent-nobatch"], model, probe, logs, config=config, batching=False
                )
            elif name == "fastapi":
                cm = fastapi_endpoint(model_file, model, probe, logs)
            elif name == "lean":  # the agent's sessions, nothing of the agent around them
                own = ModelConfig(**tomllib.loads(AGENT_CONFIG.get(model, "")))
                cm = lean_server(model_file, model, probe, logs, instances=own.instances)
            else:
                cm = mlserver(model_file, model, probe, logs, scratch)
            servers[name] = stack.enter_context(cm)
        loaded = {  # as the agents loaded the model: batching, its size, what tuning measured
            name: httpx.get(f"{servers[name].base_url}/v2/models/{model}").json()["parameters"]
            for name in servers
            if name.startswith("agent")
        }
        plan = [(c, s, k) for c in concurrencies for s in systems for k in BODY_KINDS[s]]
        for server in servers.values():  # warm connections, caches and allocator pools
            run_load(server.infer_url(model), *bodies.json, 4, 1.0)
        for rep in range(repeat):
            raw_runs.append(
                raw_throughput(model_file, bodies.row, best, duration_s, instances=best_instances)
            )
            shift = rep * len(plan) // max(repeat, 1)
            for c, s, k in plan[shift:] + plan[:shift]:
                cell = cells.setdefault((s, k, c), Cell(model, s, k, c))
                bracketed = (model, s, k, c) in RAW_BRACKETED
                raw_args = (model_file, bodies.row, best, duration_s)
                before = raw_throughput(*raw_args, instances=best_instances) if bracketed else 0
                run = measure(servers[s], model, bodies, k, c, duration_s)
                if bracketed:
                    after = raw_throughput(*raw_args, instances=best_instances)
                    run["raw_around_rows_per_s"] = [before, after]
                cell.runs.append(run)
                rate = cell.runs[-1]["requests_per_s"]
                print(f"{model} rep {rep} {s}/{k} c={c}: {rate:.0f}/s", file=sys.stderr)
        over = overload(servers["agent"], model, bodies, 512, overload_s) if overload_s else None
        startup = {name: s.started_s for name, s in servers.items()}
    return {
        "model": model,
        "raw": {
            "best_batch": best,
            "best_instances": best_instances,
            "calibration_rows_per_s": {f"{k}x{b}": r for (k, b), r in calib.items()},
            "runs_rows_per_s": raw_runs,
        },
        "agent_config": AGENT_CONFIG.get(model, ""),
        "nobatch_config": NOBATCH_CONFIG.get(model, ""),
        "agent_parameters": loaded,
        "cells": [asdict(c) for c in cells.values()],
        "overload": over,
        "startup_to_first_inference_s": startup,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32, 128])
    parser.add_argument("--systems", nargs="+", default=list(BODY_KINDS))
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--overload-duration", type=float, default=20.0)
    parser.add_argument("--json", type=Path, default=Path("bench-serving.json"))
    args = parser.parse_args()
    started = time.time()
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for model in args.models:
            results.append(
                run_model(
                    model,
                    args.concurrency,
                    args.duration,
                    args.repeat,
                    args.systems,
                    Path(scratch) / model,
                    args.overload_duration,
                )
            )
    report = {
        "started_unix": started,
        "duration_s": args.duration,
        "repeat": args.repeat,
        "concurrency": args.concurrency,
        "models": results,
    }
    args.json.write_text(json.dumps(report, indent=1))
    print(args.json)


if __name__ == "__main__":
    main()
