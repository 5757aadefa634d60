"""Agent variants side by side at one serving cell, with raw ONNX Runtime between every run.

For a change whose effect is a few percent, on a machine whose speed moves more than that from
minute to minute. Each variant (a model configuration, environment variables, another code tree
through ``PYTHONPATH``) is started once and kept running; each pair of rounds runs the variants
in a rotated order; raw ONNX Runtime in this process, at the given number of sessions and batch
size, is measured before the first run and after every run, and each run is compared with the
mean of the two raw runs either side of it. Prints one JSON document::

    python -m benchmarks.serving.ab --model cnn --body binary --concurrency 8 --pairs 4 \\
        --variant '{"name": "now", "config": "instances = 3\\n"}' \\
        --variant '{"name": "before", "config": "instances = 3\\n",
                    "env": {"PYTHONPATH": "/tmp/before"}}'

(``git worktree add /tmp/before <commit>`` makes the code tree of a commit.)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.serving.bodies import make_bodies
from benchmarks.serving.serving import raw_throughput
from benchmarks.serving.suite import measure
from benchmarks.serving.systems import Running, agent
from runtimes.examples import write_example_repository
from runtimes.formats import find_model_file


@dataclass
class Variant:
    name: str
    config: str = ""
    """The model's config.toml (none: the example's own)."""
    env: dict[str, str] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    """The model's metadata parameters as loaded (``batched``, ``max_batch_size``...)."""

    @classmethod
    def parse(cls, text: str) -> Variant:
        doc = json.loads(text)
        if not isinstance(doc, dict) or not re.fullmatch(r"[\w.-]+", str(doc.get("name"))):
            raise SystemExit(
                f"--variant {text!r}: a JSON object with a name of letters, digits, '_.-'"
            )
        unknown = set(doc) - {"name", "config", "env"}
        if unknown:
            raise SystemExit(f"--variant {text!r}: unknown keys {sorted(unknown)}")
        return cls(doc["name"], doc.get("config", ""), dict(doc.get("env", {})))

    def summary(self) -> dict[str, Any]:
        ratios = [r["ratio_to_raw"] for r in self.runs]
        return {
            "name": self.name,
            "config": self.config,
            "env": self.env,
            "parameters": self.parameters,
            "median_ratio_to_raw": statistics.median(ratios),
            "mean_ratio_to_raw": statistics.fmean(ratios),
            "runs": self.runs,
        }


def compare(
    variants: list[Variant],
    *,
    model: str,
    body: str,
    concurrency: int,
    duration_s: float,
    pairs: int,
    raw_instances: int,
    raw_batch: int,
) -> dict[str, Any]:
    bodies = make_bodies(model)
    with tempfile.TemporaryDirectory(prefix="edgefleet-ab-") as scratch, ExitStack() as stack:
        servers: dict[str, Running] = {}
        for variant in variants:
            logs = Path(scratch) / variant.name
            repo = logs / "models"
            write_example_repository(repo, models=(model,))
            servers[variant.name] = stack.enter_context(
                agent(repo, model, bodies.json[0], logs, config=variant.config, env=variant.env)
            )
            # what the agent chose at load: batching, its size, what [batching] tune measured
            metadata = httpx.get(f"{servers[variant.name].base_url}/v2/models/{model}").json()
            variant.parameters = metadata.get("parameters", {})
        # every variant's repository holds the same example model
        model_file, _ = find_model_file(repo / model / "1")

        def raw() -> float:
            return raw_throughput(
                model_file, bodies.row, raw_batch, duration_s, instances=raw_instances
            )

        for server in servers.values():  # warm the connections and the model
            measure(server, model, bodies, body, concurrency, min(duration_s, 2.0))
        raw_before = raw()
        for i in range(pairs):
            turn = i % len(variants)
            for variant in variants[turn:] + variants[:turn]:
                run = measure(servers[variant.name], model, bodies, body, concurrency, duration_s)
                raw_after = raw()
                run["raw_around_rows_per_s"] = [raw_before, raw_after]
                run["ratio_to_raw"] = run["requests_per_s"] / ((raw_before + raw_after) / 2)
                variant.runs.append(run)
                print(
                    f"{variant.name}: {run['requests_per_s']:.0f} req/s, raw "
                    f"{raw_before:.0f}/{raw_after:.0f}, ratio {run['ratio_to_raw']:.3f}",
                    file=sys.stderr,
                    flush=True,
                )
                raw_before = raw_after
    return {
        "model": model,
        "body": body,
        "concurrency": concurrency,
        "duration_s": duration_s,
        "pairs": pairs,
        "raw": {"instances": raw_instances, "batch": raw_batch},
        "variants": [v.summary() for v in variants],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--body", default="binary", choices=["json", "binary"])
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("-d", "--duration", type=float, default=4.0, help="seconds per run")
    parser.add_argument("--pairs", type=int, default=4, help="rounds of every variant")
    parser.add_argument("--raw-instances", type=int, default=2)
    parser.add_argument("--raw-batch", type=int, default=1)
    parser.add_argument(
        "--variant", action="append", required=True, help='{"name", "config", "env"} as JSON'
    )
    args = parser.parse_args(argv)
    variants = [Variant.parse(v) for v in args.variant]
    if len({v.name for v in variants}) != len(variants):
        raise SystemExit("--variant: every variant needs its own name")
    report = compare(
        variants,
        model=args.model,
        body=args.body,
        concurrency=args.concurrency,
        duration_s=args.duration,
        pairs=args.pairs,
        raw_instances=args.raw_instances,
        raw_batch=args.raw_batch,
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
