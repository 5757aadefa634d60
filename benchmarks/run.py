"""``python -m benchmarks``: the whole benchmark suite in one run, written into docs/benchmarks.md.

Serving (agent with and without batching, raw ONNX Runtime, a plain FastAPI endpoint, MLServer),
footprint, and fleet scale (``python -m benchmarks.fleet.fleet``, run as its own process when
the control plane is installed), then the report: the page docs/benchmarks.md (goals, method,
machine, how to rerun, plots) and every cell in benchmarks/runs.md. Run from the repository's
root, where the ``benchmarks`` package is (it is not in the wheel). ``--quick`` is a smoke run
of every part.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click


def _step(args: list[str]) -> None:
    click.echo(f"$ {shlex.join(args)}", err=True)
    subprocess.run(args, check=True)


@click.command("bench")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("docs"),
    show_default=True,
    help="Where benchmarks.md and its plots go.",
)
@click.option(
    "--runs",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("benchmarks/runs.md"),
    show_default=True,
    help="Where the tables of every cell go.",
)
@click.option(
    "--results",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("bench-results"),
    show_default=True,
    help="Where the raw JSON goes.",
)
@click.option("--quick", is_flag=True, help="A short smoke run of every part.")
@click.option(
    "--skip",
    multiple=True,
    type=click.Choice(["serving", "footprint", "fleet"]),
    help="Leave a part out (its previous JSON is reused if present).",
)
@click.option("--devices", multiple=True, type=int, help="Fleet sizes (default 1000 5000).")
@click.option(
    "--duration",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds per serving measurement.",
)
@click.option(
    "--repeat",
    type=int,
    default=3,
    show_default=True,
    help="Repetitions of every measurement (medians are reported).",
)
def bench(
    out: Path,
    runs: Path,
    results: Path,
    quick: bool,
    skip: tuple[str, ...],
    devices: tuple[int, ...],
    duration: float,
    repeat: int,
) -> None:
    """Run the benchmark suite and write docs/benchmarks.md and benchmarks/runs.md."""
    results.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC)
    py = sys.executable
    serving, footprint, fleet = (results / f"{p}.json" for p in ("serving", "footprint", "fleet"))
    if quick:
        duration, repeat = 2.0, 1
    if "serving" not in skip:
        args = [py, "-m", "benchmarks.serving.suite", "--json", str(serving)]
        args += ["--duration", str(duration), "--repeat", str(repeat)]
        if quick:
            args += ["--concurrency", "8", "32", "--overload-duration", "5"]
        _step(args)
    if "footprint" not in skip:
        _step(
            [
                py,
                "-m",
                "benchmarks.serving.footprint",
                "--json",
                str(footprint),
                "--repeat",
                str(repeat),
            ]
        )
    if "fleet" not in skip and importlib.util.find_spec("control_plane") is not None:
        sizes = [str(d) for d in devices] or (["200"] if quick else ["1000", "5000"])
        args = [py, "-m", "benchmarks.fleet.fleet", "--json", str(fleet), "--devices", *sizes]
        args += ["--repeat", str(repeat)]
        if quick:
            args += ["--idle-s", "2", "--ingest-step-s", "3"]
        _step(args)
    from benchmarks.serving.report import render  # matplotlib: not at CLI start-up

    command = shlex.join(["python", "-m", "benchmarks", *sys.argv[1:]])
    # a run's JSON records neither the commit nor the hours; a render of saved results has none
    note = _provenance(started, datetime.now(UTC)) if len(set(skip)) < 3 else ""
    target = render(_load(serving), _load(footprint), _load(fleet), out, command, runs, note)
    click.echo(target)
    click.echo(runs)


def _provenance(started: datetime, ended: datetime) -> str:
    """``at <commit> on <day>, <start>-<end> UTC``; without the commit outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        )
        at = f"at {head.stdout.strip()} " if head.returncode == 0 else ""
    except OSError:
        at = ""
    return f"{at}on {started:%Y-%m-%d, %H:%M}-{ended:%H:%M} UTC"


def _load(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc
