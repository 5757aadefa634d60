"""Render a run's results (JSON) into the page ``docs/benchmarks.md`` and the run's full tables.

The page is what a user reads: the goals with the run's figures, the method, the machine, how
to rerun, and the plots (PNG, beside it under ``docs/benchmarks/``). The tables of every cell
go to ``benchmarks/runs.md``, beside the lab notebook (``benchmarks/findings.md``), which holds
what the figures meant and what changed for them::

    python -m benchmarks.serving.report --serving bench-serving.json \\
        --footprint bench-footprint.json --fleet bench-fleet.json --out docs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.serving import plots
from benchmarks.serving.goals import Goal, evaluate, lean_reference
from benchmarks.serving.method import method_section, rerun_section
from benchmarks.serving.tables import fleet_section, footprint_section, md_table, serving_section

BENCHMARKS = Path(__file__).resolve().parents[1]
NOTEBOOK = BENCHMARKS / "findings.md"
SCALING = BENCHMARKS / "fleet" / "SCALING.md"
RUNS = Path("benchmarks") / "runs.md"
"""Where the run's full tables go by default, from the repository's root."""


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
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "kernel": platform.release(),
        **versions,
    }


def goals_section(goals: list[Goal]) -> list[str]:
    rows = [[g.name, g.target, g.measured, "met" if g.met else "**missed**"] for g in goals]
    return ["## Goals", "", *md_table(["goal", "target", "measured", ""], rows), ""]


def plots_section(serving: dict[str, Any], images: Path, rel: str) -> list[str]:
    out = [
        "## Plots",
        "",
        "Medians of the repetitions: throughput by concurrency, raw ONNX Runtime's best as a "
        "dashed line; latency percentiles at concurrency 32; the sizes of the agent's batches "
        "(binary bodies), from its own histogram.",
        "",
    ]
    for m in serving["models"]:
        out += [f"### `{m['model']}`", ""]
        for name in plots.serving_plots(m, images):
            out += [f"![{name}]({rel}/{name})", ""]
    return out


def _link(target: Path, start: Path) -> str:
    """``target`` relative to the folder ``start``, as a markdown link is read."""
    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()


def render(
    serving: dict[str, Any] | None,
    footprint: dict[str, Any] | None,
    fleet: dict[str, Any] | None,
    out: Path,
    command: str,
    runs: Path,
    note: str = "",
) -> Path:
    """Write the page ``out/benchmarks.md`` with its plots under ``out/benchmarks/``, and the
    run's full tables to ``runs``; returns the page. ``note`` follows the command: what the
    JSON does not record (the commit, the hours of the run)."""
    images = out / "benchmarks"
    images.mkdir(parents=True, exist_ok=True)
    runs.parent.mkdir(parents=True, exist_ok=True)
    page = out / "benchmarks.md"
    ran = f"Command: `{command}`" + (f" {note}" if note else "") + "."
    lines = _page(serving, footprint, fleet, ran, images, _link(runs, out))
    page.write_text("\n".join(lines).rstrip() + "\n")
    full = [
        "# Benchmark runs: every cell",
        "",
        "The latest run of `python -m benchmarks` in full, medians of its repetitions. Its "
        f"goals, method, machine and plots are on [docs/benchmarks.md]({_link(page, runs.parent)});"
        " what the figures meant, what changed for them and the notes of the runs are in the "
        f"lab notebook, [findings.md]({_link(NOTEBOOK, runs.parent)}). Written by "
        "`benchmarks/serving/report.py` with the page: change the generator, not this file. "
        f"Benchmarks run on their own (pipelines, gRPC, the console, model quality) keep their "
        f"cells in [more-runs.md]({_link(runs.parent / 'more-runs.md', runs.parent)}).",
        "",
        ran,
        "",
    ]
    if serving:
        full += serving_section(serving)
    if footprint:
        full += footprint_section(footprint)
    if fleet:
        full += fleet_section(fleet)
    runs.write_text("\n".join(full).rstrip() + "\n")
    return page


def _page(
    serving: dict[str, Any] | None,
    footprint: dict[str, Any] | None,
    fleet: dict[str, Any] | None,
    ran: str,
    images: Path,
    runs_link: str,
) -> list[str]:
    """The page: goals, method, machine, how to rerun, plots (written under ``images``)."""
    out = images.parent
    lines = [
        "# Benchmarks",
        "",
        "The agent against the strongest baseline, raw ONNX Runtime in-process, and against "
        "the servers a user would otherwise run (a plain FastAPI endpoint, MLServer); its "
        "footprint; and the control plane under a simulated fleet. Every comparison is a ratio "
        "of figures measured side by side in the same run on the same machine. Absolute "
        "numbers on a shared 2-core machine mean little; the ratios are the result.",
        "",
        "Generated by `python -m benchmarks` (`benchmarks/serving/report.py`). Every cell of "
        f"the run is in [benchmarks/runs.md]({runs_link}); what profiling found, what "
        "changed and the notes of the runs are in the lab notebook, "
        f"[benchmarks/findings.md]({_link(NOTEBOOK, out)}); how the fleet scales past one "
        f"machine in [benchmarks/fleet/SCALING.md]({_link(SCALING, out)}).",
        "",
        ran,
        "",
        *goals_section(evaluate(serving, footprint, fleet)),
    ]
    reference = lean_reference(serving) if serving else None
    if reference:
        lines += [reference, ""]
    lines += method_section(serving, footprint, fleet)
    lines += [
        "## Machine",
        "",
        "As the report found it; `python -m benchmarks` renders right after the run.",
        "",
        *md_table(["", ""], [[k, v] for k, v in machine().items()]),
        "",
    ]
    lines += rerun_section()
    if serving:
        lines += plots_section(serving, images, images.name)
    return lines


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
    parser.add_argument("--runs", type=Path, default=RUNS, help="where every cell goes")
    parser.add_argument("--command", default="python -m benchmarks")
    parser.add_argument("--note", default="", help="after the command: commit, hours, host")
    args = parser.parse_args()
    target = render(
        _load(args.serving),
        _load(args.footprint),
        _load(args.fleet),
        args.out,
        args.command,
        args.runs,
        args.note,
    )
    print(target)


if __name__ == "__main__":
    main()
