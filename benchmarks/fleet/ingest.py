"""The control plane's CPU per telemetry message at a fixed rate, code trees side by side.

The fleet benchmark's ingest ratio is decided by the control plane's share of a machine that
the broker and the simulator share with it, and it moves with the machine. A change to ingest
is judged better by what a stored message costs the control plane at a rate it keeps up with,
measured with the code before and after taking turns. For each round and each ``--tree`` in
turn: a fresh broker, control plane (that tree first on its ``PYTHONPATH``; ``.`` is the
installed code) and simulator of ``--devices``, telemetry offered at ``--rate`` for
``--duration`` seconds, then drained. Prints one JSON document: per tree and round, what was
sent and stored, the control plane's CPU (cores, microseconds per stored message, the event
loop's thread apart from the others: SQLite's, the executor's), and the broker's and the
simulator's cores::

    git worktree add /tmp/before <commit>
    python -m benchmarks.fleet.ingest --devices 5000 --rate 30000 --duration 20 \\
        --rounds 2 --tree now=. --tree before=/tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.fleet import phases
from benchmarks.fleet.measure import start_fleet

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user and system) of each thread of ``pid``, by thread id, from ``/proc``."""
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # the thread ended
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) * TICK_S
    return out


def measure_tree(
    workdir: Path, tree: Path | None, devices: int, rate_per_s: float, duration_s: float
) -> dict[str, Any]:
    """One fleet with the control plane of ``tree`` (None: the installed code), one step."""
    env = None if tree is None else {"PYTHONPATH": str(tree.resolve())}
    sim_procs = max(1, min(2, devices // 4000))
    with ExitStack() as stack:
        fleet = start_fleet(
            stack, workdir, devices, sim_procs=sim_procs, interval_s=10.0, control_plane_env=env
        )
        pid = fleet.monitor.procs["control_plane"][0].pid
        ran_with = fleet.monitor.procs["control_plane"][0].environ().get("PYTHONPATH", "")
        before = thread_cpu_s(pid)
        step = phases.ingest_step(fleet, rate_per_s, duration_s, drain_s=max(2.0, duration_s))
        after = thread_cpu_s(pid)
    # ingest_step's CPU window is the offered window; the threads' is the whole step (drain and
    # settling too), so they are given per message stored, not as cores. On a loaded machine
    # the offered window may store nothing (all of it lands in the drain), so the per-message
    # figure is the whole step's process CPU over what it stored, defined whenever one was.
    loop_s = after.get(pid, 0.0) - before.get(pid, 0.0)
    others_s = sum(t - before.get(tid, 0.0) for tid, t in after.items() if tid != pid)
    stored, res = step["stored"], step["resources"]
    cores = res["control_plane"]["cpu_cores"]
    per_s = step["stored_per_s_during"]
    process_s = loop_s + others_s
    return {
        "control_plane_pythonpath": ran_with,
        "sent": step["sent"],
        "stored": stored,
        "lost": step["lost_in_run"],
        "passed": step["passed"],
        "stored_per_s_during": per_s,
        "control_plane_cores": cores,
        "control_plane_us_per_message": round(1e6 * process_s / stored, 2) if stored else None,
        "event_loop_us_per_message": round(1e6 * loop_s / stored, 2) if stored else None,
        "other_threads_us_per_message": round(1e6 * others_s / stored, 2) if stored else None,
        "mosquitto_cores": res["mosquitto"]["cpu_cores"],
        "simulator_cores": res["simulator"]["cpu_cores"],
        "control_plane_rss_mib": res["control_plane"]["rss_mib"],
    }


def parse_tree(text: str) -> tuple[str, Path | None]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=PATH (PATH . for this install)")
    if path == ".":
        return name, None
    if not (Path(path) / "control_plane").is_dir():
        raise argparse.ArgumentTypeError(f"{path!r} holds no control_plane package")
    return name, Path(path)


def compare(
    trees: list[tuple[str, Path | None]],
    *,
    devices: int,
    rate_per_s: float,
    duration_s: float,
    rounds: int,
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
    for i in range(rounds):
        turn = i % len(trees)
        for name, tree in trees[turn:] + trees[:turn]:
            with tempfile.TemporaryDirectory(prefix=f"ingest-{name}-") as tmp:
                run = measure_tree(Path(tmp), tree, devices, rate_per_s, duration_s)
            runs[name].append(run)
            print(f"{name}: {json.dumps(run)}", file=sys.stderr, flush=True)
    return {
        "devices": devices,
        "offered_per_s": rate_per_s,
        "duration_s": duration_s,
        "trees": [
            {
                "name": name,
                "path": str(tree) if tree else ".",
                "median_control_plane_us_per_message": _median(
                    [r["control_plane_us_per_message"] for r in runs[name]]
                ),
                "runs": runs[name],
            }
            for name, tree in trees
        ],
    }


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=5000)
    p.add_argument("--rate", type=float, default=30000.0, help="telemetry messages/s offered")
    p.add_argument("--duration", type=float, default=20.0, help="seconds offered per run")
    p.add_argument("--rounds", type=int, default=2, help="runs of every tree, in turn")
    p.add_argument(
        "--tree",
        type=parse_tree,
        action="append",
        help="NAME=PATH of a code tree whose control plane runs (. for this install)",
    )
    args = p.parse_args(argv)
    trees = args.tree or [("installed", None)]
    if len({name for name, _ in trees}) != len(trees):
        p.error("--tree: every tree needs its own name")
    started = time.monotonic()
    report = compare(
        trees,
        devices=args.devices,
        rate_per_s=args.rate,
        duration_s=args.duration,
        rounds=args.rounds,
    )
    report["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
