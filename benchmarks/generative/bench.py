"""The generative benchmark: four systems on one model folder, side by side in one run.

Systems (README.md here says why each is set up as it is):

- ``raw``: :func:`benchmarks.generative.inproc.raw_loop`, batch 1, the limit for one stream;
- ``genai``: onnxruntime-genai's static ``Engine`` (:mod:`benchmarks.generative.inproc`);
- ``agent``: ``edgefleet agent`` on a repository holding only the model, shipped defaults,
  streamed over ``/v1/completions`` (SSE);
- ``llamacpp``: llama.cpp's server (``xllamacpp``) on a GGUF of the same weights
  (:mod:`benchmarks.generative.gguf_export`), streamed the same way.

The in-process systems run in a child process per measurement; the two servers stay up for the
whole run, and each concurrency level runs every system once per repeat in a rotating order.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.generative import client
from benchmarks.serving.systems import free_port
from runtimes.examples.tiny_lm import LmSize

MODEL = "tiny-lm"
PROMPT = "The edge device serves models close to where the data is made. An operator asks"
ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = ("raw", "genai", "agent", "llamacpp")
"""The default run; ``agent-1t`` (the agent with ``--peer-threads`` compute threads, not its
shipped default) can be named too."""


@dataclass(frozen=True)
class Plan:
    size: LmSize = LmSize.BENCH
    levels: tuple[int, ...] = (1, 4, 8, 16)
    max_tokens: int = 64
    long_tokens: int = 128
    repeats: int = 2
    systems: tuple[str, ...] = SYSTEMS
    timeout_s: float = 120.0
    peer_threads: int = 1
    """Compute threads of the raw loop, ORT GenAI and llama.cpp (README.md: why 1 here)."""


@dataclass
class Server:
    name: str
    base: str
    proc: subprocess.Popen[bytes]

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")


@dataclass
class Results:
    runs: dict[tuple[str, int], list[list[dict[str, Any]]]] = field(default_factory=dict)
    rss_mib: dict[str, float] = field(default_factory=dict)
    ttft_pairs: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "EDGEFLEET_AGENT_ACCESS_LOG": "false",
        "EDGEFLEET_AGENT_LOG_LEVEL": "WARNING",
    }


def prepare(work: Path, size: LmSize, need_gguf: bool) -> tuple[Path, Path, Path]:
    """The repository (only the LM), its version folder, and the GGUF beside them."""
    from benchmarks.generative.gguf_export import write_gguf
    from runtimes.examples.repository import write_example_repository

    repository = work / f"repository-{size.value}"
    folder = repository / MODEL / "1"
    if not (folder / "genai_config.json").exists():
        write_example_repository(repository, models=(MODEL,), lm_size=size, overwrite=True)
    gguf = work / f"{MODEL}-{size.value}.gguf"
    if need_gguf and not gguf.exists():
        write_gguf(folder, gguf)
    return repository, folder, gguf


def _wait_ready(server: Server, model: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    body = {"model": model, "prompt": "hi", "max_tokens": 1}
    with httpx.Client(timeout=10) as http:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise RuntimeError(f"{server.name} exited with {server.proc.returncode}")
            try:
                if http.post(f"{server.base}/v1/completions", json=body).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    raise RuntimeError(f"{server.name}: not ready within {timeout_s} s")


@contextmanager
def serve(
    name: str, args: list[str], port: int, model: str, logs: Path, env: dict[str, str] | None = None
) -> Iterator[Server]:
    with (logs / f"{name}.log").open("wb") as log:
        environment = {**_env(), **(env or {})}
        proc = subprocess.Popen(
            args, env=environment, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
        )
    server = Server(name, f"http://127.0.0.1:{port}", proc)
    try:
        _wait_ready(server, model, 180)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def agent(repository: Path, logs: Path, name: str = "agent", **env: str) -> Any:
    """``edgefleet agent`` on ``repository``; ``env`` adds settings (none: shipped defaults)."""
    port = free_port()
    args = [sys.executable, "-m", "common.cli", "agent", "--model-repository", str(repository)]
    return serve(name, [*args, "--port", str(port), "--no-grpc"], port, MODEL, logs, env)


def llamacpp(gguf: Path, slots: int, context: int, threads: int, logs: Path) -> Any:
    port = free_port()
    module = "benchmarks.generative.llamacpp_server"
    args = [
        sys.executable,
        "-m",
        module,
        str(gguf),
        str(port),
        str(slots),
        str(context),
        str(threads),
    ]
    return serve("llamacpp", args, port, client.LLAMACPP, logs)


def _inproc(system: str, folder: Path, streams: int, plan: Plan) -> tuple[list[Any], float]:
    args = [sys.executable, "-m", "benchmarks.generative.inproc", system, str(folder)]
    args += [str(streams), str(plan.max_tokens), PROMPT, str(plan.peer_threads)]
    done = subprocess.run(
        args, env=_env(), capture_output=True, check=True, timeout=plan.timeout_s, cwd=ROOT
    )
    out = json.loads(done.stdout)
    return out["streams"], float(out["rss_mib"])


def run(plan: Plan, work: Path) -> Results:
    """Every system at every level, alternating; then the short request under load."""
    work.mkdir(parents=True, exist_ok=True)
    repository, folder, gguf = prepare(work, plan.size, "llamacpp" in plan.systems)
    context = json.loads((folder / "genai_config.json").read_text())["model"]["context_length"]
    results = Results()
    with ExitStack() as stack:
        servers: dict[str, Server] = {}
        if "agent" in plan.systems:
            servers["agent"] = stack.enter_context(agent(repository, work))
        if "agent-1t" in plan.systems:
            one = {"EDGEFLEET_AGENT_RUNTIME__INTRA_OP_THREADS": str(plan.peer_threads)}
            servers["agent-1t"] = stack.enter_context(agent(repository, work, "agent-1t", **one))
        if "llamacpp" in plan.systems:
            slots = max(plan.levels)
            servers["llamacpp"] = stack.enter_context(
                llamacpp(gguf, slots, context, plan.peer_threads, work)
            )
        for name, server in servers.items():
            # first requests pay for lazy allocation (both servers grow their buffers once)
            model = client.LLAMACPP if name == "llamacpp" else MODEL
            asyncio.run(client.streams(server.base, model, PROMPT, 4, 8, plan.timeout_s))
        for level in plan.levels:
            for repeat in range(plan.repeats):
                order = [s for s in plan.systems if s != "raw" or level == 1]
                shift = (repeat + level) % len(order)
                for system in order[shift:] + order[:shift]:
                    records = _measure(system, level, plan, folder, servers, results)
                    results.runs.setdefault((system, level), []).append(records)
                    _progress(work, system, level, records)
        for repeat in range(plan.repeats):
            names = sorted(servers, reverse=repeat % 2 == 1)
            for name in names:
                pair = asyncio.run(
                    client.short_under_load(
                        servers[name].base,
                        client.LLAMACPP if name == "llamacpp" else MODEL,
                        PROMPT,
                        8,
                        plan.long_tokens,
                        plan.timeout_s,
                    )
                )
                results.ttft_pairs.setdefault(name, []).append(pair)
        for name, server in servers.items():
            results.rss_mib[name] = server.peak_rss_mib()
    return results


def _measure(
    system: str, level: int, plan: Plan, folder: Path, servers: dict[str, Server], res: Results
) -> list[dict[str, Any]]:
    if system in servers:
        model = client.LLAMACPP if system == "llamacpp" else MODEL
        coro = client.streams(
            servers[system].base, model, PROMPT, level, plan.max_tokens, plan.timeout_s
        )
        return asyncio.run(coro)
    records, rss = _inproc(system, folder, level, plan)
    for r in records:
        r["tokens"] = len(r["times"])
    res.rss_mib[system] = max(res.rss_mib.get(system, 0.0), rss)
    return records


def _progress(work: Path, system: str, level: int, records: list[dict[str, Any]]) -> None:
    """A line on stderr and in ``runs.jsonl``, so a run cut short still leaves its figures."""
    rate = summarise([records])["tokens_per_s"]
    print(f"{system} x{level}: {rate:.0f} tokens/s", file=sys.stderr, flush=True)
    with (work / "runs.jsonl").open("a") as out:
        out.write(json.dumps({"system": system, "streams": level, "records": records}) + "\n")


def summarise(records: list[list[dict[str, Any]]]) -> dict[str, float]:
    """Median tokens/s over repeats; TTFT and inter-token percentiles pooled over them."""
    rates, ttft, gaps = [], [], []
    for run_records in records:
        tokens = sum(r["tokens"] for r in run_records)
        wall = max(r["times"][-1] for r in run_records) - min(r["sent"] for r in run_records)
        rates.append(tokens / wall)
        for r in run_records:
            ttft.append(r["times"][0] - r["sent"])
            gaps.extend(np.diff(r["times"]).tolist())
    return {
        "tokens_per_s": float(np.median(rates)),
        "ttft_p50_ms": 1e3 * float(np.percentile(ttft, 50)),
        "ttft_p99_ms": 1e3 * float(np.percentile(ttft, 99)),
        "itl_p50_ms": 1e3 * float(np.percentile(gaps, 50)) if gaps else float("nan"),
        "itl_p99_ms": 1e3 * float(np.percentile(gaps, 99)) if gaps else float("nan"),
    }
