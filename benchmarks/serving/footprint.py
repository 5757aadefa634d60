"""Footprint: idle memory with ``mlp`` loaded, and time from process start to first inference.

Each system is started ``--repeat`` times, alternately; "first inference" is the first
successful V2 request, polled every 20 ms from the moment the process is spawned. The agent is
measured cold (an empty compiled-model cache) and warm (the cache its previous start wrote).
Idle RSS is summed over the server's process tree, two seconds after the first inference::

    python -m benchmarks.serving.footprint --repeat 3 --json bench-footprint.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from benchmarks.serving.bodies import make_bodies
from benchmarks.serving.systems import Running, agent, fastapi_endpoint, mlserver
from runtimes.examples import write_example_repository
from runtimes.formats import find_model_file

SETTLE_S = 2.0


def measure_once(
    name: str, scratch: Path, repo: Path, model_file: Path, probe: bytes
) -> dict[str, float]:
    logs = scratch / "logs"
    logs.mkdir(exist_ok=True)
    cache = scratch / "cache"
    if name == "agent-cold":
        shutil.rmtree(cache, ignore_errors=True)
    cm: AbstractContextManager[Running]
    if name.startswith("agent"):
        cm = agent(repo, "mlp", probe, logs, cache_dir=cache)
    elif name == "fastapi":
        cm = fastapi_endpoint(model_file, "mlp", probe, logs)
    else:
        cm = mlserver(model_file, "mlp", probe, logs, scratch)
    with cm as server:
        time.sleep(SETTLE_S)  # let start-up garbage be collected and threads park
        return {
            "start_to_first_inference_s": server.started_s,
            "idle_rss_mb": server.tree_rss_bytes() / 2**20,
            "processes": 1 + len(server.process.children(recursive=True)),
        }


def run(repeat: int, systems: list[str]) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        repo = scratch / "models"
        write_example_repository(repo, models=("mlp",))
        model_file, _ = find_model_file(repo / "mlp" / "1")
        probe = make_bodies("mlp").json[0]
        for _ in range(repeat):
            for name in systems:  # agent-cold before agent-warm: the warm start reuses its cache
                runs[name].append(measure_once(name, scratch, repo, model_file, probe))
    summary = {
        name: {
            key: statistics.median(r[key] for r in rs)
            for key in ("start_to_first_inference_s", "idle_rss_mb", "processes")
        }
        for name, rs in runs.items()
    }
    return {"repeat": repeat, "summary": summary, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--systems", nargs="+", default=["agent-cold", "agent-warm", "fastapi", "mlserver"]
    )
    parser.add_argument("--json", type=Path, default=Path("bench-footprint.json"))
    args = parser.parse_args()
    args.json.write_text(json.dumps(run(args.repeat, args.systems), indent=1))
    print(args.json)


if __name__ == "__main__":
    main()
