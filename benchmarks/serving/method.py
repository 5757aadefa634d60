"""The page's prose: what the benchmark compares and how, and how to run it again.

What a run's JSON records (durations, repetitions, the agents' model configuration) is taken
from it; the rest describes the suite's code as it is (``suite.py``, ``systems.py``,
``footprint.py``, ``benchmarks/fleet/fleet.py``).
"""

from __future__ import annotations

from typing import Any


def method_section(
    serving: dict[str, Any] | None, footprint: dict[str, Any] | None, fleet: dict[str, Any] | None
) -> list[str]:
    out = [
        "## Method",
        "",
        "Every system runs on this machine with the same model file and ONNX Runtime's thread "
        "defaults, and is measured side by side with the others in the same run.",
        "",
    ]
    if serving:
        out += _serving(serving)
    if footprint:
        out += [
            f"- **Footprint**: `mlp` loaded, {footprint['repeat']} starts of each system in "
            "turn, medians. Start-up is from spawning the process to the first successful "
            "inference (polled every 20 ms); the agent cold has an empty compiled-model cache, "
            "warm reuses the one its previous start wrote. Idle RSS is summed over the "
            "server's process tree, two seconds after the first inference.",
        ]
    if fleet:
        out += [
            "- **Fleet**: simulated devices speak the real protocol (birth, telemetry, signed "
            "manifests verified against the trust root, update states through committed, "
            "rollback commands) against a real Mosquitto and the real control plane (SQLite), "
            "a fresh pair for each fleet size. Each size runs single-wave rollouts to 99 % "
            "committed, each followed by a fleet-wide rollback; then the rate a bare "
            "subscriber receives from the broker, an ingest sweep (offered telemetry rising "
            "step by step: the highest rate stored with nothing lost), and the bare rate "
            "again. The ingest ratio is to the median of both bare measurements.",
        ]
    out.append("")
    return out


def _serving(serving: dict[str, Any]) -> list[str]:
    configs = []
    for m in serving["models"]:
        if m.get("agent_config"):
            said = f"`{m['model']}` with `{_one_line(m['agent_config'])}`"
            if m.get("nobatch_config"):
                said += f" (`agent-nobatch`: `{_one_line(m['nobatch_config'])}`)"
            configs.append(said)
    beyond = f" Beyond the defaults, the suite serves {'; '.join(configs)}." if configs else ""
    concs = ", ".join(str(c) for c in serving.get("concurrency", []))
    out = [
        "- **`agent`, as shipped**: `edgefleet agent` with its default settings, dynamic "
        "batching on, each example model in a repository of its own; `agent-nobatch` is the "
        f"same agent with batching off.{beyond}",
        "- **Raw ONNX Runtime, the strongest baseline**: the same model file run in the "
        "benchmark's own process, no server and no transport, at the best of every batch size "
        "(1 to 32) and one to three sessions side by side, chosen by a calibration before the "
        "model's cells and measured again at the start of every repetition. For the cells the "
        "`cnn` goal compares it with, raw is also measured right before and right after each "
        "run, and the goal takes the mean of the two.",
        "- **The servers a user would otherwise run**: `fastapi`, a plain FastAPI endpoint "
        "that runs ONNX Runtime per request, JSON as users write it; `mlserver`, MLServer 1.7 "
        "with adaptive batching (up to 32 rows, 2 ms). For scale, not a goal: `lean`, the "
        "leanest Python server of the V2 infer route around the agent's own sessions (no "
        "batching, validation, limits or metrics).",
        "- **Models**: `mlp`, a small MLP, where the server's own work per request sets the "
        "pace; `cnn`, a MobileNetV2-like CNN on a 224 x 224 image (600 KB a request), where "
        "compute does.",
        f"- **Load**: a closed loop of one-row requests from a separate process, at "
        f"concurrency {concs}, {serving['duration_s']:g} s per cell, {serving['repeat']} "
        "repetitions, each walking every (concurrency, system, body) cell in an order rotated "
        "by the repetition; medians. `json` is V2 JSON, `binary` is V2 with Triton's binary "
        "tensor extension (the agent and `lean`; MLServer has no binary extension). CPU is "
        "the server's process tree (MLServer's workers included), per successful inference. "
        "A ratio goal is the median of the ratios within repetitions, the machine's speed "
        "moving between them; the ratio of the medians is shown beside it.",
    ]
    over = next((m["overload"] for m in serving["models"] if m.get("overload")), None)
    if over:
        out.append(
            f"- **Overload**: the agent at concurrency {over['concurrency']} for "
            f"{over['duration_s']:g} s with binary bodies, its memory sampled every 0.2 s, "
            "then 2 s at concurrency 1."
        )
    return out


def _one_line(config: str) -> str:
    return config.strip().replace("\n", "; ")


RERUN = """\
## How to rerun

From the repository's root, with the project installed for development (the `benchmarks`
package is not in the wheel). MLServer gets a virtual environment of its own on first use
(pip, so that run needs the network); the fleet part needs `mosquitto` on the `PATH` and is left
out where the control plane is not installed.

```sh
# everything: the JSON under --results, then this page, its plots and benchmarks/runs.md
python -m benchmarks --results docs/benchmarks/results
python -m benchmarks --quick        # a short smoke run of every part
python -m benchmarks --skip fleet   # leave a part out; its previous JSON is reused
# render again from saved JSON
python -m benchmarks.serving.report --out docs --serving docs/benchmarks/results/serving.json \\
    --footprint docs/benchmarks/results/footprint.json --fleet docs/benchmarks/results/fleet.json
```

One cell, or one question, at a time (each module's docstring says more):

```sh
# one cell, measured as the suite measures it (raw ONNX Runtime around each run)
python -m benchmarks.serving.suite --models cnn --systems agent lean --concurrency 8 \\
    --duration 4 --repeat 3 --overload-duration 0 --json cnn-c8.json
# the agent against raw ONNX Runtime, alternating
python -m benchmarks.serving.serving --model cnn --concurrency 8
# variants (config, environment, another code tree) with raw between every two runs
python -m benchmarks.serving.ab --model cnn --body binary -c 8 --pairs 4
# the event loop's Python calls per request: a count, where a timing is noise
python -m benchmarks.serving.calls --model mlp --body json -c 32
python -m benchmarks.serving.footprint --repeat 3 --json footprint.json
python -m benchmarks.fleet.fleet --devices 5000 --repeat 3 --json fleet.json
# the control plane's CPU per stored message, code trees in turn
python -m benchmarks.fleet.ingest --devices 5000 --rate 20000 --tree now=. --tree before=/tmp/before
python -m benchmarks.startup --repeat 5  # cold against warm start
```
"""


def rerun_section() -> list[str]:
    return [*RERUN.splitlines(), ""]
