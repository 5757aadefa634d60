"""Ingest on PostgreSQL with one control plane replica against two, side by side.

For each round, each replica count in turn: a fresh database on the PostgreSQL server at
``--pg-admin``, a fresh broker and simulator of ``--devices``, that many control plane
replicas (one shared subscription group), telemetry offered at ``--rate`` for ``--duration``
seconds, then drained. Prints one JSON document: per replica count and round, what was sent and
stored, and the CPU per stored message of each part (the replicas together, the PostgreSQL
backends serving them, Mosquitto, the simulator): the profile that explains the ratio::

    python -m benchmarks.fleet.replicas --devices 2000 --rate 3000 --duration 15 --rounds 2

With ``--rollout-timeout-s``, each fleet then takes a single-wave rollout to every device and
its fleet-wide rollback, timed as the fleet benchmark times them (``--replicas 2 --devices
20000 --rounds 1 --rollout-timeout-s 300``: the 20,000-device rollout on two replicas).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks.fleet import phases
from benchmarks.fleet.measure import start_fleet

PARTS = ("control_plane", "postgres", "mosquitto", "simulator")
IDLE_S = 5.0
COMMITS = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"


@contextmanager
def database(admin_url: str) -> Iterator[str]:
    import psycopg

    name = f"edgefleet_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.replace("postgresql://", "postgresql+psycopg://").rsplit("/", 1)[0] + (
            f"/{name}"
        )
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def measure(
    admin_url: str,
    replicas: int,
    devices: int,
    rate_per_s: float,
    duration_s: float,
    rollout_timeout_s: float = 0.0,
    profile_dir: Path | None = None,
) -> dict[str, Any]:
    """One fleet, one ingest step; with ``rollout_timeout_s``, then a single-wave rollout to
    every device and its fleet-wide rollback (:func:`phases.rollout_and_rollback`)."""
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"replicas-{replicas}-") as tmp, ExitStack() as s:
        db_url = s.enter_context(database(admin_url))
        fleet = start_fleet(
            s,
            Path(tmp),
            devices,
            sim_procs=max(1, min(2, devices // 4000)),
            interval_s=10.0,
            db_url=db_url,
            replicas=replicas,
            profile_dir=profile_dir,
        )
        fleet.set_rate(0)
        phases.settle(fleet)
        idle_phase = fleet.monitor.start_phase()
        time.sleep(IDLE_S)  # what the parts cost with no telemetry: timers, renewals, polls
        idle = fleet.monitor.end_phase(idle_phase)
        commits = fleet.db.scalar(COMMITS)
        step = phases.ingest_step(fleet, rate_per_s, duration_s, drain_s=max(2.0, duration_s))
        time.sleep(1.0)  # PostgreSQL publishes its counters within a second
        commits = fleet.db.scalar(COMMITS) - commits
        rollout = (
            phases.rollout_and_rollback(fleet, 2, rollout_timeout_s) if rollout_timeout_s else None
        )
    res, per_s = step["resources"], step["stored_per_s_during"]
    return {
        "replicas": replicas,
        "sent": step["sent"],
        "stored": step["stored"],
        "lost": step["lost_in_run"],
        "passed": step["passed"],
        "stored_per_s_during": per_s,
        "cores": {part: res[part]["cpu_cores"] for part in PARTS},
        "us_per_message": {
            part: round(1e6 * res[part]["cpu_cores"] / per_s, 2) if per_s else None
            for part in PARTS
        },
        "idle_cores": {part: idle[part]["cpu_cores"] for part in PARTS},
        # the transactions committed in the database over the step, per stored message: each
        # replica writes its own batches, so more replicas at one rate mean smaller batches
        "messages_per_commit": round(step["stored"] / commits, 1) if commits > 0 else None,
        "rollout": rollout,
    }


def compare(
    admin_url: str,
    counts: list[int],
    *,
    devices: int,
    rate_per_s: float,
    duration_s: float,
    rounds: int,
    rollout_timeout_s: float = 0.0,
    profile_dir: Path | None = None,
) -> dict[str, Any]:
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    for i in range(rounds):
        turn = i % len(counts)  # the order alternates: neither always runs on a warmer host
        for n in counts[turn:] + counts[:turn]:
            run = measure(
                admin_url,
                n,
                devices,
                rate_per_s,
                duration_s,
                rollout_timeout_s,
                profile_dir / f"{n}-{i}" if profile_dir else None,
            )
            runs[n].append(run)
            print(f"{n} replica(s): {json.dumps(run)}", file=sys.stderr, flush=True)
    medians = {
        n: {
            part: statistics.median(r["us_per_message"][part] or 0.0 for r in runs[n])
            for part in PARTS
        }
        for n in counts
    }
    return {
        "devices": devices,
        "offered_per_s": rate_per_s,
        "duration_s": duration_s,
        "median_us_per_message": medians,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=2000)
    p.add_argument("--rate", type=float, default=4000.0, help="telemetry messages/s offered")
    p.add_argument("--duration", type=float, default=15.0, help="seconds offered per run")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    p.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument(
        "--rollout-timeout-s",
        type=float,
        default=0.0,
        help="then a single-wave rollout and its rollback, each within this (0: none)",
    )
    p.add_argument(
        "--profile-dir",
        type=Path,
        help="run each control plane under cProfile, its profile written here (<replicas>-"
        "<round>/control-plane-<k>.prof)",
    )
    args = p.parse_args(argv)
    report = compare(
        args.pg_admin,
        args.replicas,
        devices=args.devices,
        rate_per_s=args.rate,
        duration_s=args.duration,
        rounds=args.rounds,
        rollout_timeout_s=args.rollout_timeout_s,
        profile_dir=args.profile_dir,
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
