"""Zero-touch enrolment at scale: ``--devices`` devices join at once with one claim.

A real Mosquitto (``--accounts dynsec``: its dynamic security plugin, the broker directory
``edgefleet fleet dynsec-config`` writes; ``password_file``: the one ``edgefleet fleet``
writes, reloaded on SIGHUP), a control plane process on a fresh PostgreSQL database (the
server at ``--pg-admin``) and the simulated devices of :mod:`benchmarks.fleet.enrolsim`, each
a real process on 127.0.0.1::

    python -m benchmarks.fleet.enrolment --devices 5000 --accounts password_file

Prints one JSON document: the seconds until every device was provisioned (its claim exchanged,
then its status published with its new login and acknowledged by the broker), p50 and p99 per
device, the 429s and 503s the devices waited after, what the control plane's database holds at
the end (enrolled, online) and the CPU each part used.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from benchmarks.fleet import stack
from benchmarks.fleet.measure import Monitor, _backends
from benchmarks.fleet.replicas import database
from benchmarks.fleet.stack import LineChild, process, wait_for
from control_plane.provisioning.acl import CONTROL_PLANE_USER
from control_plane.provisioning.dynsec_broker import write_dynsec_broker
from control_plane.provisioning.mosquitto import FleetAccess

DYNSEC_PLUGINS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib")


def dynsec_plugin() -> str:
    for folder in DYNSEC_PLUGINS:
        path = Path(folder) / "mosquitto_dynamic_security.so"
        if path.is_file():
            return str(path)
    raise FileNotFoundError("no mosquitto_dynamic_security.so (Debian's mosquitto package)")


def broker_config(
    workdir: Path, state: Path, port: int, accounts: str, control_plane_port: int
) -> Path:
    """The broker's mosquitto.conf as ``edgefleet fleet`` writes it, logins required: the
    devices on ``port``, the control plane on ``control_plane_port`` (its own listener)."""
    owner = "root" if os.geteuid() == 0 else None  # started as root: stay root
    if accounts == "password_file":
        return FleetAccess(state).write_config(
            workdir / "broker",
            port=port,
            bind="127.0.0.1",
            owner=owner,
            control_plane_port=control_plane_port,
        )
    return write_dynsec_broker(
        FleetAccess(state),
        workdir / "broker",
        port=port,
        control_plane_port=control_plane_port,
        bind="127.0.0.1",
        plugin=Path(dynsec_plugin()),
        owner=owner,
    ).conf


def cp_config(
    workdir: Path, state: Path, mqtt_port: int, port: int, db_url: str, accounts: str
) -> Path:
    path = workdir / "control-plane.toml"
    doc = {
        "db_url": db_url,
        "mqtt_url": f"mqtt://127.0.0.1:{mqtt_port}",
        "mqtt_username": CONTROL_PLANE_USER,
        "mqtt_password_file": str(FleetAccess(state).service().password_file),
        "port": port,
        "state_dir": str(state),
        "artifact_dir": str(state / "artifacts"),
        "log_level": "WARNING",
        "enrolment": {"accounts": accounts},
    }
    path.write_text(tomli_w.dumps(doc))
    return path


def percentile(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 3)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 3)


def run(
    devices: int,
    accounts: str,
    pg_admin: str,
    http_connections: int,
    keep: Path | None = None,
    profile: bool = False,
) -> dict[str, Any]:
    """One run; ``keep``: its files (logs, the broker's) go there and stay."""
    with tempfile.TemporaryDirectory(prefix="enrolment-") as tmp, ExitStack() as s:
        workdir = keep or Path(tmp)
        logs = workdir / "logs"
        logs.mkdir(parents=True)
        state = workdir / "control-plane"
        db_url = s.enter_context(database(pg_admin))
        mqtt_port, cp_port, cp_mqtt_port = stack.free_port(), stack.free_port(), stack.free_port()
        conf = broker_config(workdir, state, mqtt_port, accounts, cp_mqtt_port)
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        broker = s.enter_context(process([exe, "-c", str(conf)], logs / "mosquitto.out"))
        wait_for("the broker", lambda: stack.port_open(mqtt_port), 20)
        config = cp_config(workdir, state, cp_mqtt_port, cp_port, db_url, accounts)
        cp_args = [str(Path(sys.executable).parent / "edgefleet"), "control-plane"]
        cp_args += ["--config", str(config)]
        if profile:  # cProfile writes it when the control plane exits (SIGTERM: a clean exit)
            cp_args = [sys.executable, "-m", "cProfile", "-o", str(logs / "cp.prof"), *cp_args]
        cp = s.enter_context(process(cp_args, logs / "control-plane.log"))
        health = f"http://127.0.0.1:{cp_port}/health"
        wait_for("the control plane", lambda: httpx.get(health).status_code == 200, 120)
        api = s.enter_context(stack.admin_client(workdir, cp_port))
        claim = api.post(
            "/api/v1/claims",
            json={"name": "bench", "max_uses": devices, "labels": {"group": "zt"}},
        )
        claim.raise_for_status()
        token_file = workdir / "claim"
        token_file.write_text(claim.json()["token"])
        db = stack.PgDatabase(db_url)
        s.callback(db.close)
        pids = {
            "control_plane": [cp.pid],
            "mosquitto": [broker.pid],
            "postgres": _backends(db_url.rsplit("/", 1)[-1]),
        }
        sim_args = [sys.executable, "-m", "benchmarks.fleet.enrolsim", "--url"]
        sim_args += [f"http://127.0.0.1:{cp_port}", "--token-file", str(token_file)]
        sim_args += ["--port", str(mqtt_port), "--count", str(devices)]
        sim_args += ["--http-connections", str(http_connections)]
        sim_proc = s.enter_context(
            process(sim_args, logs / "enrolsim.log", stdin=True, stdout=True)
        )
        sim = LineChild(sim_proc)
        monitor = Monitor({**pids, "simulator": [sim_proc.pid]})
        s.callback(monitor.close)
        phase = monitor.start_phase()
        result = sim.read()  # every device joined or failed
        resources = monitor.end_phase(phase)
        summary = {k: v for k, v in result.items() if not k.endswith("_s")}
        print(json.dumps(summary), file=sys.stderr, flush=True)
        # the control plane's own view: enrolled, and online from the status it received
        with contextlib.suppress(TimeoutError):  # reported as counted
            wait_for(
                "the inventory to list every provisioned device online",
                lambda: (
                    db.scalar("SELECT count(*) FROM devices WHERE online")
                    >= len(result["provisioned_s"])
                ),
                60,
            )
        enrolled = db.scalar("SELECT count(*) FROM enrolments WHERE state = 'enrolled'")
        online = db.scalar("SELECT count(*) FROM devices WHERE online")
        sim.send("quit")
    provisioned = result["provisioned_s"]
    return {
        "devices": devices,
        "accounts": accounts,
        "provisioned": len(provisioned),
        "failed": result["failed"],
        "failures": result["failures"],
        "all_provisioned_s": round(max(provisioned), 3) if len(provisioned) == devices else None,
        "p50_s": percentile(provisioned, 50),
        "p99_s": percentile(provisioned, 99),
        "enrolled_p50_s": percentile(result["enrolled_s"], 50),
        "enrolled_p99_s": percentile(result["enrolled_s"], 99),
        "waits": result["waits"],
        "refused_logins": result["refused_logins"],
        "slow_logins": result.get("slow_logins", 0),
        "db_enrolled": enrolled,
        "db_online": online,
        "resources": resources,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=5000)
    p.add_argument("--accounts", choices=["dynsec", "password_file"], default="password_file")
    p.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--http-connections", type=int, default=500, help="the simulator's pool")
    p.add_argument("--keep", type=Path, help="a new folder for the run's files, kept")
    p.add_argument("--profile", action="store_true", help="the control plane under cProfile")
    args = p.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    report = run(
        args.devices, args.accounts, args.pg_admin, args.http_connections, args.keep, args.profile
    )
    print(json.dumps({"started": started, **report}, indent=2))


if __name__ == "__main__":
    main()
