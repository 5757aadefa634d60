"""One fleet on one broker and one control plane: start it, then measure a rollout, a
fleet-wide rollback and telemetry ingest. The driver (:mod:`benchmarks.fleet.fleet`) and
the correctness test both use it."""

from __future__ import annotations

import functools
import math
import sys
import threading
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.fleet import stack
from benchmarks.fleet.stack import LineChild, process, wait_for

BARE_PREFIX = "bare"


class Monitor:
    """CPU and RSS of the benchmark's processes, sampled in a thread every ``interval_s``."""

    def __init__(self, pids: dict[str, list[int]], interval_s: float = 0.5) -> None:
        self.procs = {role: [psutil.Process(p) for p in ps] for role, ps in pids.items()}
        self.interval_s = interval_s
        self.peak_rss: dict[str, int] = dict.fromkeys(pids, 0)
        self._cpu: dict[int, float] = {}
        """Each process's CPU seconds at its last sample."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-monitor")
        self._thread.start()

    def _sample(self) -> dict[str, tuple[float, int]]:
        out = {}
        for role, procs in self.procs.items():
            cpu, rss = 0.0, 0
            for p in procs:
                try:
                    with p.oneshot():
                        t = p.cpu_times()
                        self._cpu[p.pid] = t.user + t.system
                        rss += p.memory_info().rss
                except psutil.NoSuchProcess:
                    # a PostgreSQL backend whose connection the pool closed: its CPU up to its
                    # last sample still counts
                    if p.pid not in self._cpu:
                        raise
                cpu += self._cpu[p.pid]
            out[role] = (cpu, rss)
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                for role, (_, rss) in self._sample().items():
                    self.peak_rss[role] = max(self.peak_rss[role], rss)
            except psutil.Error:
                return

    def start_phase(self) -> tuple[float, dict[str, tuple[float, int]]]:
        self.peak_rss = dict.fromkeys(self.procs, 0)
        return time.monotonic(), self._sample()

    def end_phase(self, started: tuple[float, dict[str, tuple[float, int]]]) -> dict[str, Any]:
        t0, before = started
        wall, after = time.monotonic() - t0, self._sample()
        return {
            role: {
                "cpu_cores": round((after[role][0] - before[role][0]) / wall, 3),
                "rss_mib": round(max(self.peak_rss[role], after[role][1]) / 2**20, 1),
            }
            for role in self.procs
        } | {"wall_s": round(wall, 2)}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass
class Fleet:
    devices: int
    api: httpx.Client
    db: stack.Database
    sims: list[LineChild]
    bare: LineChild
    monitor: Monitor
    connect_s: float

    def tell(self, cmd: dict[str, Any]) -> list[dict[str, Any]]:
        for s in self.sims:
            s.send(__import__("json").dumps(cmd))
        return [s.read() for s in self.sims]

    def stats(self) -> dict[str, Any]:
        parts = self.tell({"op": "stats"})
        total: dict[str, Any] = {"sent": {}, "rejected": {}, "versions": {}}
        for p in parts:
            for key in ("connected", "lost", "acked", "events_sent", "skipped", "received"):
                total[key] = total.get(key, 0) + p[key]
            for key in ("sent", "rejected", "versions"):
                for k, v in p[key].items():
                    total[key][k] = total[key].get(k, 0) + v
        total["cpu_s"] = sum(p["cpu_s"] for p in parts)
        return total

    def marks(self, state: str, since: float) -> list[float]:
        times = [
            t
            for p in self.tell({"op": "marks", "state": state, "since": since})
            for t in p["times"]
        ]
        return sorted(times)

    def set_rate(self, per_s: float | None, prefix: str | None = None) -> None:
        share = None if per_s is None else per_s / len(self.sims)
        self.tell({"op": "rate", "per_s": share, "prefix": prefix})

    def wait_versions(self, version: int, timeout_s: float) -> None:
        wait_for(
            f"every simulated device on v{version}",
            lambda: self.stats()["versions"].get(str(version), 0) == self.devices,
            timeout_s,
        )

    def stored_telemetry(self) -> int:
        return self.db.scalar("SELECT count(*) FROM device_telemetry")


def start_fleet(
    stack_: ExitStack,
    workdir: Path,
    devices: int,
    *,
    sim_procs: int,
    interval_s: float,
    control_plane_env: Mapping[str, str] | None = None,
    db_url: str | None = None,
    replicas: int = 0,
    profile_dir: Path | None = None,
) -> Fleet:
    """Broker, control plane (with a validated v2 to roll out), bare subscriber and simulator
    processes; returns once the control plane lists every device online.
    ``control_plane_env`` is added to the control plane's environment only (a ``PYTHONPATH``
    to run another code tree's control plane against the same simulator). ``db_url``: a
    PostgreSQL database instead of SQLite; ``replicas``: that many control plane replicas
    on it, splitting ingest by a shared subscription (0: one plain control plane).
    ``profile_dir``: each control plane runs under cProfile, its profile written there
    (``<name>.prof``) when it stops."""
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    mqtt_port = stack.free_port()
    broker = stack_.enter_context(
        process(stack.mosquitto_args(workdir, mqtt_port), logs / "mosquitto.out")
    )
    wait_for("the broker", lambda: stack.port_open(mqtt_port), 20)
    exe = str(Path(sys.executable).parent / "edgefleet")
    cps = []
    ports = []
    # the first replica alone first: it creates the keys the others then read
    for replica in range(replicas) if replicas else [None]:
        cp_port = stack.free_port()
        config = stack.control_plane_config(
            workdir, mqtt_port, cp_port, db_url=db_url, replica=replica
        )
        name = "control-plane" if replica is None else f"control-plane-{replica}"
        args = [exe, "control-plane", "--config", str(config)]
        if profile_dir is not None:
            args = [
                sys.executable,
                "-m",
                "cProfile",
                "-o",
                str(profile_dir / f"{name}.prof"),
            ] + args
        cps.append(
            stack_.enter_context(
                process(
                    args,
                    logs / f"{name}.log",
                    env=control_plane_env,
                )
            )
        )
        url = f"http://127.0.0.1:{cp_port}/health"
        wait_for(name, functools.partial(_healthy, url), 120)
        ports.append(cp_port)
    api = stack_.enter_context(stack.admin_client(workdir, ports[0]))
    stack.push_version(api, workdir, 2)
    bare_args = [sys.executable, "-m", "benchmarks.fleet.baresub", "--port", str(mqtt_port)]
    bare_args += ["--filter", f"{BARE_PREFIX}/devices/+/telemetry"]
    bare = LineChild(
        stack_.enter_context(process(bare_args, logs / "baresub.log", stdin=True, stdout=True))
    )
    bare.read()
    trust = workdir / "control-plane" / "trust-root.json"
    per = math.ceil(devices / sim_procs)
    sims = []
    for k in range(sim_procs):
        count = min(per, devices - k * per)
        args = stack.sim_args(mqtt_port, trust, k * per, count, interval_s)
        proc = process(args, logs / f"fleetsim-{k}.log", stdin=True, stdout=True)
        sims.append(LineChild(stack_.enter_context(proc)))
    try:
        connect_s = max(s.read()["connect_s"] for s in sims)
    except RuntimeError as exc:  # the workdir goes with the run: say why the simulator ended
        tails = [(logs / f"fleetsim-{k}.log").read_text()[-2000:] for k in range(sim_procs)]
        raise RuntimeError(f"{exc}; its log ends:\n" + "\n".join(tails)) from None
    db = (
        stack.PgDatabase(db_url)
        if db_url
        else stack.Database(workdir / "control-plane" / "edgefleet.db")
    )
    stack_.callback(db.close)
    wait_for(
        f"{devices} devices online in the inventory",
        lambda: db.scalar("SELECT count(*) FROM devices WHERE online") >= devices,
        120 + devices / 50,
    )
    pids = {
        "control_plane": [cp.pid for cp in cps],
        "mosquitto": [broker.pid],
        "simulator": [s.proc.pid for s in sims],
        "bare_subscriber": [bare.proc.pid],
    }
    if db_url:  # the server's processes that serve this database's connections
        pids["postgres"] = _backends(db_url.rsplit("/", 1)[-1])
    monitor = Monitor(pids)
    stack_.callback(monitor.close)
    fleet = Fleet(devices, api, db, sims, bare, monitor, connect_s)
    stack_.callback(
        lambda: fleet.tell({"op": "quit"}) if all(s.proc.poll() is None for s in sims) else None
    )
    return fleet


def _backends(database: str) -> list[int]:
    """The PostgreSQL backend processes connected to ``database`` (named in their title)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        line = " ".join(p.info["cmdline"] or [])
        if line.startswith("postgres:") and f" {database} " in line:
            found.append(p.pid)
    return found


def _healthy(url: str) -> bool:
    return httpx.get(url).status_code == 200
