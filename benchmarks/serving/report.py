"""Render the benchmark results (JSON) into ``docs/benchmarks.md`` and PNG plots.

    python -m benchmarks.serving.report --serving bench-serving.json \\
        --footprint bench-footprint.json --fleet bench-fleet.json --out docs
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.serving import plots
from benchmarks.serving.goals import Goal, evaluate, lean_reference
from benchmarks.serving.tables import fleet_section, md_table, num

NOTES = Path(__file__).with_name("findings.md")


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for dist in ("onnxruntime", "fastapi", "uvicorn", "numpy", "paho-mqtt"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "-"
    import os

    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "kernel": platform.release(),
        **versions,
    }


def serving_section(serving: dict[str, Any], images: Path, rel: str) -> list[str]:
    out = [
        "## Serving",
        "",
        f"Closed-loop load of one-row requests for {serving['duration_s']:g} s per cell, "
        f"{serving['repeat']} repetitions in rotated order; medians. `json` is V2 JSON, `binary` "
        "is V2 with Triton's binary tensor extension (the agent, and `lean`, the leanest Python "
        "server of the V2 infer route, for scale; MLServer has no binary extension and the "
        "plain endpoint is JSON as users write it). CPU is the server's process "
        "tree (MLServer's workers included), per successful inference.",
        "",
    ]
    for m in serving["models"]:
        model = m["model"]
        raw = m["raw"]
        raw_rps = statistics.median(raw["runs_rows_per_s"])
        out += [
            f"### `{model}`",
            "",
            f"Raw ONNX Runtime in-process, best batch size {raw['best_batch']}"
            f"{_sessions(raw.get('best_instances', 1))}: "
            f"**{raw_rps:.0f} rows/s** (median of {len(raw['runs_rows_per_s'])}).",
            "",
        ]
        if m.get("agent_config"):
            config = m["agent_config"].strip().replace("\n", "; ")
            said = f"The agent's model configuration: `{config}`"
            if m.get("nobatch_config"):
                nobatch = m["nobatch_config"].strip().replace("\n", "; ")
                said += f"; without batching (`agent-nobatch`): `{nobatch}`"
            out += [said + ".", ""]
        for name, params in m.get("agent_parameters", {}).items():
            tuning = params.get("batch_tuning")
            if tuning:
                rates = ", ".join(f"{r:,.0f} at {b}" for b, r in tuning["rows_per_s"].items())
                chose = (
                    "no batching"
                    if tuning["max_batch_size"] == 1
                    else f"batches of up to {tuning['max_batch_size']} rows"
                )
                out += [
                    f"`{name}` measured at load (`[batching] tune`, {tuning['elapsed_s']:.2f} s)"
                    f" rows/s of {rates} rows, and served with {chose}.",
                    "",
                ]
        concs = sorted({c["concurrency"] for c in m["cells"]})
        rows = []
        for system, body in sorted({(c["system"], c["body"]) for c in m["cells"]}):
            line = [f"{system} ({body})"]
            for conc in concs:
                cell = _cell(m, system, body, conc)
                line.append(num(_median(cell, "requests_per_s"), 0) if cell else "-")
            rows.append(line)
        out += ["Throughput (successful requests/s) by concurrency:", ""]
        out += md_table(["system", *[f"c={c}" for c in concs]], rows)
        for conc in concs:
            rows = []
            for system, body in sorted({(c["system"], c["body"]) for c in m["cells"]}):
                cell = _cell(m, system, body, conc)
                if cell is None:
                    continue
                rows.append(
                    [f"{system} ({body})"]
                    + [num(_median(cell, k), 1) for k in ("p50_ms", "p95_ms", "p99_ms")]
                    + [num(_median(cell, "server_cpu_ms_per_inference"), 2)]
                    + [num(_median(cell, "mean_batch_rows"), 1)]
                    + [num(_median(cell, k), 2) for k in ("server_cpu_cores", "client_cpu_cores")]
                    + [_errors(cell)]
                )
            header = [
                "system",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "CPU ms/inf",
                "mean batch",
                "server cores",
                "client cores",
                "non-200",
            ]
            out += ["", f"Concurrency {conc}:", ""] + md_table(header, rows)
        for name in plots.serving_plots(m, images):
            out += ["", f"![{name}]({rel}/{name})"]
        over = m.get("overload")
        if over:
            out += [
                "",
                f"Overload, concurrency {over['concurrency']} for {over['duration_s']:g} s "
                f"(binary): statuses {over['statuses']}, connection errors {over['errors']}; "
                f"RSS idle {over['idle_rss_mb']:.0f} MB, peak {over['max_rss_mb']:.0f} MB; "
                f"afterwards at concurrency 1: {over['after_statuses']}, "
                f"p50 {over['after_p50_ms']:.1f} ms.",
            ]
        out.append("")
    return out


def _cell(m: dict[str, Any], system: str, body: str, conc: int) -> dict[str, Any] | None:
    for c in m["cells"]:
        if (c["system"], c["body"], c["concurrency"]) == (system, body, conc):
            return dict(c)
    return None


def _median(cell: dict[str, Any], key: str) -> float | None:
    values = [r[key] for r in cell["runs"] if r.get(key) is not None]
    return statistics.median(values) if values else None


def _errors(cell: dict[str, Any]) -> str:
    bad = sum(n for r in cell["runs"] for s, n in r["statuses"].items() if s != "200")
    bad += sum(r["errors"] for r in cell["runs"])
    return str(bad)


def footprint_section(footprint: dict[str, Any]) -> list[str]:
    rows = [
        [
            name,
            num(v["idle_rss_mb"], 0),
            num(v["start_to_first_inference_s"], 2),
            str(int(v["processes"])),
        ]
        for name, v in footprint["summary"].items()
    ]
    return [
        "## Footprint",
        "",
        f"`mlp` loaded, medians of {footprint['repeat']} starts; start-up is from spawning the "
        "process to the first successful inference (polled every 20 ms). The agent cold start "
        "has an empty compiled-model cache, the warm one reuses it.",
        "",
        *md_table(["system", "idle RSS MB", "start to first inference s", "processes"], rows),
        "",
    ]


def goals_section(goals: list[Goal]) -> list[str]:
    rows = [[g.name, g.target, g.measured, "met" if g.met else "**missed**"] for g in goals]
    return ["## Goals", "", *md_table(["goal", "target", "measured", ""], rows), ""]


def render(
    serving: dict[str, Any] | None,
    footprint: dict[str, Any] | None,
    fleet: dict[str, Any] | None,
    out: Path,
    command: str,
    extra: Sequence[Path] = (),
) -> Path:
    """Write ``out/benchmarks.md`` and its plots; ``extra`` are markdown files appended (the
    fleet benchmark's scaling notes)."""
    images = out / "benchmarks"
    images.mkdir(parents=True, exist_ok=True)
    info = machine()
    lines = [
        "# Benchmarks",
        "",
        "Generated by `edgefleet bench`; every comparison is a ratio of figures measured side "
        "by side in the same run on the same machine. Absolute numbers on a shared 2-core "
        "machine mean little; the ratios are the result.",
        "",
        f"Command: `{command}`",
        "",
        *md_table(["", ""], [[k, v] for k, v in info.items()]),
        "",
        *goals_section(evaluate(serving, footprint, fleet)),
    ]
    reference = lean_reference(serving) if serving else None
    if reference:
        lines += [reference, ""]
    if NOTES.exists():
        lines += [NOTES.read_text().strip(), ""]
    if serving:
        lines += serving_section(serving, images, "benchmarks")
    if footprint:
        lines += footprint_section(footprint)
    if fleet:
        lines += fleet_section(fleet)
    for path in extra:
        lines += [path.read_text().strip(), ""]
    target = out / "benchmarks.md"
    target.write_text("\n".join(lines).rstrip() + "\n")
    return target


def _load(path: Path | None) -> dict[str, Any] | None:
    if path is None or not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serving", type=Path)
    parser.add_argument("--footprint", type=Path)
    parser.add_argument("--fleet", type=Path)
    parser.add_argument("--out", type=Path, default=Path("docs"))
    parser.add_argument("--command", default="edgefleet bench")
    args = parser.parse_args()
    target = render(
        _load(args.serving), _load(args.footprint), _load(args.fleet), args.out, args.command
    )
    print(target)


if __name__ == "__main__":
    main()


def _sessions(instances: int) -> str:
    return "" if instances == 1 else f", {instances} sessions side by side"
