"""The fleet-scale benchmark driver.

    python -m benchmarks.fleet.fleet --devices 1000 5000 --repeat 3 --json fleet.json

For each fleet size: a fresh Mosquitto, a fresh control plane (SQLite in a scratch
directory) and the simulator; ``--repeat`` single-wave rollouts each followed by an abort
(fleet-wide rollback); the bare subscriber's rate, an ingest sweep, and the bare rate again.
Every figure is kept, with its median. The JSON file is rewritten after each fleet size, so a
run stopped part way keeps what it measured; a size that fails records why and the driver goes
on to the next.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.fleet import phases
from benchmarks.fleet.measure import Fleet, start_fleet
from benchmarks.fleet.stack import mosquitto_config

GOALS = {"devices": 5000, "rollout_99pct_s": 60.0, "ingest_ratio": 0.5}


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with Path("/proc/cpuinfo").open() as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mosquitto = subprocess.run(
        ["mosquitto", "-h"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    versions = {
        name: importlib.metadata.version(name)
        for name in ("paho-mqtt", "aiomqtt", "pydantic", "SQLAlchemy", "aiosqlite", "uvloop")
    }
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "mosquitto": mosquitto[0] if mosquitto else "unknown",
        "sqlite": sqlite3.sqlite_version,
        **versions,
    }


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def summarise(reps: list[dict[str, Any]]) -> dict[str, Any]:
    def col(phase: str, key: str) -> list[float | None]:
        return [r[phase][key] for r in reps]

    return {
        "rollout_99pct_committed_s": _median(col("rollout", "to_99pct_committed_s")),
        "rollout_all_committed_s": _median(col("rollout", "to_all_committed_s")),
        "rollout_device_view_99pct_s": _median(col("rollout", "device_view_99pct_s")),
        "rollout_api_call_s": _median(col("rollout", "api_call_s")),
        "rollback_99pct_reverted_s": _median(col("rollback", "to_99pct_reverted_s")),
        "rollback_done_s": _median(col("rollback", "to_rolled_back_s")),
        "rollback_device_view_99pct_s": _median(col("rollback", "device_view_99pct_s")),
    }


def run_size(
    n: int, args: argparse.Namespace, workdir: Path, result: dict[str, Any]
) -> dict[str, Any]:
    """Measure one fleet size into ``result`` (filled as it goes: a size stopped part way
    keeps the repetitions it finished)."""
    sim_procs = args.sim_procs or max(1, min(2, n // 4000))
    with ExitStack() as stack:
        fleet = start_fleet(
            stack, workdir, n, sim_procs=sim_procs, interval_s=args.telemetry_interval_s
        )
        result |= {"simulator_processes": sim_procs, "connect_s": round(fleet.connect_s, 2)}
        phase = fleet.monitor.start_phase()
        time.sleep(args.idle_s)
        result["idle"] = fleet.monitor.end_phase(phase)
        reps: list[dict[str, Any]] = []
        result["repetitions"] = reps
        for i in range(args.repeat):
            rep = phases.rollout_and_rollback(fleet, 2, args.timeout_s)
            print(f"  N={n} rep {i + 1}: {summarise([rep])}", flush=True)
            reps.append(rep)
            result["summary"] = summarise(reps)
        try:
            if args.ingest_step_s > 0:
                result["ingest"] = ingest(fleet, n, args)
        except Exception as exc:  # keep the rollout figures of this size
            traceback.print_exc()
            result["ingest"] = {"stopped": f"{type(exc).__name__}: {exc}"}
        result["simulator"] = fleet.stats()
    return result


def ingest(fleet: Fleet, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """The bare subscriber's rate, ``--repeat`` times before the control plane's sweep and as
    many after it, so a machine that speeds up or slows down during the sweep moves both
    sides of the ratio; the figure is the highest lossless step as a share of the median of
    all of them (the sweep's ceiling is the median of those before)."""
    before = [phases.bare_rate(fleet, args.ingest_step_s) for _ in range(args.repeat)]
    ceiling = _median([b["delivered_per_s"] for b in before]) or 0.0
    print(f"  N={n} bare subscriber before: {ceiling:.0f} msg/s", flush=True)
    sweep = phases.ingest_sweep(
        fleet,
        args.ingest_start_per_s,
        args.ingest_factor,
        ceiling,
        args.ingest_step_s,
        args.ingest_refine,
    )
    after = [phases.bare_rate(fleet, args.ingest_step_s) for _ in range(args.repeat)]
    after_per_s = _median([b["delivered_per_s"] for b in after])
    bare_per_s = _median([b["delivered_per_s"] for b in before + after]) or 0.0
    best = sweep["max_lossless_per_s"]
    print(
        f"  N={n} ingest: {best} msg/s lossless of {bare_per_s:.0f} (bare after: {after_per_s})",
        flush=True,
    )
    return {
        "bare": before + after,
        "bare_before_per_s": ceiling,
        "bare_after_per_s": after_per_s,
        "bare_delivered_per_s": bare_per_s,
        "sweep": sweep,
        "ratio_to_bare": round(best / bare_per_s, 3) if best and bare_per_s else None,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Fleet-scale benchmark on one machine.")
    p.add_argument("--devices", type=int, nargs="+", default=[1000, 5000])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", type=Path, default=Path("fleet-bench.json"))
    p.add_argument("--workdir", type=Path, default=None, help="kept; default a temp dir")
    p.add_argument("--sim-procs", type=int, default=0, help="0: one per 4,000 devices, max 2")
    p.add_argument("--telemetry-interval-s", type=float, default=10.0)
    p.add_argument("--idle-s", type=float, default=10.0)
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--ingest-step-s", type=float, default=10.0, help="0 skips ingest")
    p.add_argument("--ingest-start-per-s", type=float, default=2000.0)
    p.add_argument("--ingest-factor", type=float, default=1.25)
    p.add_argument(
        "--ingest-refine", type=int, default=2, help="steps halving the gap at the limit"
    )
    args = p.parse_args(argv)
    doc: dict[str, Any] = {
        "command": " ".join(
            [Path(sys.executable).name, "-m", "benchmarks.fleet.fleet", *(argv or sys.argv[1:])]
        ),
        "machine": machine(),
        "goals": GOALS,
        "settings": {
            "telemetry_interval_s": args.telemetry_interval_s,
            "repeat": args.repeat,
            "ingest_step_s": args.ingest_step_s,
            "mosquitto_conf": mosquitto_config(1883, Path("WORKDIR")),
            "control_plane": (
                "SQLite, ingest batches up to 20,000 messages (1 s of telemetry, 0.2 s with an "
                "event), broker inflight 40,000, rollout tick 1 s"
            ),
            "simulator_client": "lean MQTT 3.1.1 on asyncio (benchmarks/fleet/mqttlite.py)",
        },
        "sizes": [],
    }
    started = time.monotonic()
    for n in args.devices:
        with tempfile.TemporaryDirectory(prefix=f"fleet-{n}-") as tmp:
            workdir = args.workdir / str(n) if args.workdir else Path(tmp)
            print(f"N={n}: starting (work dir {workdir})", flush=True)
            result: dict[str, Any] = {"devices": n}
            doc["sizes"].append(result)
            try:
                run_size(n, args, workdir, result)
            except BaseException as exc:  # an interrupt too: what was measured is written
                traceback.print_exc()
                result["stopped"] = f"{type(exc).__name__}: {exc}"
                if not isinstance(exc, Exception):
                    args.json.write_text(json.dumps(doc, indent=2))
                    raise
            finally:
                doc["wall_s"] = round(time.monotonic() - started, 1)
                args.json.write_text(json.dumps(doc, indent=2))
    print(f"wrote {args.json}", flush=True)


if __name__ == "__main__":
    main()
