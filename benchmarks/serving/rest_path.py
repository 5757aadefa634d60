"""The agent's REST path against what a user writes by hand: latency at one client, idle memory.

Two measurements, each of systems started side by side and measured in turn, the order rotated
at every repetition, so that their ratios come from the same minutes:

- ``latency``: ``mlp``, V2 JSON, one client; p50 and p99 of each system, and the agent's over
  the fast hand-written endpoint's (``fastapi-async``: async FastAPI, orjson, uvloop and
  httptools, the session run on the event loop) within each repetition;
- ``memory``: idle resident memory with ``mlp`` and ``cnn`` both loaded, with no config.toml,
  two seconds after a first inference of each, over the plain endpoint's with the same two.

``--before DIR`` adds the agent of another code tree (``git worktree add DIR <commit>``) as
``agent-before``, so a change is measured against the code before it in the same run::

    python -m benchmarks.serving.rest_path --repeat 3 --duration 4 --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import httpx

from benchmarks.serving.bodies import make_bodies
from benchmarks.serving.suite import measure
from benchmarks.serving.systems import Running, agent, fastapi_endpoint
from runtimes.examples import write_example_repository
from runtimes.formats import find_model_file

SETTLE_S = 2.0
BASELINE = "fastapi-async"


def _systems(
    scratch: Path, models: tuple[str, ...], before: Path | None, config: str
) -> dict[str, AbstractContextManager[Running]]:
    """Every system serving ``models`` (the first one probed at start)."""
    logs = scratch / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    probe = make_bodies(models[0]).json[0]
    trees = {"agent": None} | ({"agent-before": before} if before is not None else {})
    made: dict[str, AbstractContextManager[Running]] = {}
    files: list[Path] = []
    for name, tree in trees.items():
        repo = scratch / name / "models"
        write_example_repository(repo, models=models)
        for model in models[1:]:  # agent() writes the first model's config.toml
            if config:
                (repo / model / "config.toml").write_text(config)
        files = [find_model_file(repo / m / "1")[0] for m in models]
        env = {"PYTHONPATH": str(tree)} if tree is not None else {}
        made[name] = agent(repo, models[0], probe, logs, config=config, env=env, name=name)
    made["fastapi"] = fastapi_endpoint(files, models[0], probe, logs)
    made[BASELINE] = fastapi_endpoint(files, models[0], probe, logs, fast=True)
    return made


def latency(scratch: Path, repeat: int, duration_s: float, before: Path | None) -> dict[str, Any]:
    bodies = make_bodies("mlp")
    runs: dict[str, list[dict[str, Any]]] = {}
    with ExitStack() as stack:
        servers = {
            n: stack.enter_context(cm)
            for n, cm in _systems(scratch / "latency", ("mlp",), before, "").items()
        }
        names = list(servers)
        for server in servers.values():  # warm connections, caches and allocator pools
            measure(server, "mlp", bodies, "json", 1, 1.0)
        for rep in range(repeat):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for name in order:
                run = measure(servers[name], "mlp", bodies, "json", 1, duration_s)
                runs.setdefault(name, []).append(run)
                print(
                    f"rep {rep} {name}: p50 {run['p50_ms']:.3f} p99 {run['p99_ms']:.3f} ms",
                    file=sys.stderr,
                )
    ratios = {
        name: {
            key: [r[key] / b[key] for r, b in zip(own, runs[BASELINE], strict=True)]
            for key in ("p50_ms", "p99_ms")
        }
        for name, own in runs.items()
        if name != BASELINE
    }
    return {"runs": runs, f"over_{BASELINE}": ratios}


def memory(scratch: Path, repeat: int, before: Path | None, config: str) -> dict[str, Any]:
    models = ("mlp", "cnn")
    rss: dict[str, list[float]] = {}
    for rep in range(repeat):
        made = _systems(scratch / f"memory-{rep}", models, before, config)
        for name, cm in made.items():
            with cm as server:
                for model in models[1:]:
                    body, _ = make_bodies(model).json
                    json_type = {"Content-Type": "application/json"}
                    answer = httpx.post(
                        server.infer_url(model), content=body, headers=json_type, timeout=60
                    )
                    answer.raise_for_status()
                time.sleep(SETTLE_S)  # let start-up garbage be collected and threads park
                mb = server.tree_rss_bytes() / 2**20
            rss.setdefault(name, []).append(mb)
            print(f"rep {rep} {name}: idle RSS {mb:.0f} MB", file=sys.stderr)
    base = rss["fastapi"]
    return {
        "models": list(models),
        "config": config,
        "idle_rss_mb": rss,
        "over_fastapi": {n: [a / b for a, b in zip(v, base, strict=True)] for n, v in rss.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", default=["latency", "memory"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per latency run")
    parser.add_argument("--before", type=Path, help="another code tree, run as agent-before")
    parser.add_argument(
        "--config", default="", help="config.toml of both models in the memory part"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        if "latency" in args.parts:
            out["latency"] = latency(Path(scratch), args.repeat, args.duration, args.before)
        if "memory" in args.parts:
            out["memory"] = memory(Path(scratch), args.repeat, args.before, args.config)
    summary = {
        part: {
            name: {k: round(statistics.median(v), 3) for k, v in ratio.items()}
            if isinstance(ratio, dict)
            else round(statistics.median(ratio), 3)
            for name, ratio in doc[next(k for k in doc if k.startswith("over_"))].items()
        }
        for part, doc in out.items()
    }
    out["medians_of_ratios"] = summary
    text = json.dumps(out, indent=1)
    if args.json is not None:
        args.json.write_text(text)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
