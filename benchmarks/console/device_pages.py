"""The device list's reads at fleet size: every device against a page, and the overview's
counts from every device against the summary's GROUP BYs, side by side on one control plane:

    python -m benchmarks.console.device_pages --devices 20000 [--postgresql URL]

The inventory is written straight into the control plane's database (no simulator: these are
reads), a quarter of the devices online, a quarter silent, half offline, with labels and served
model versions. Each request is timed ``--loads`` times after one warm-up, median reported, with
the bytes of its answer; the ratios are what the brief asks about (figures move with the load on
a shared machine, the ratios much less).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, insert

from benchmarks.fleet import stack
from control_plane.db.models import Device


def fill(db_url: str, devices: int) -> None:
    """``devices`` rows, in batches of 2,000."""
    now = datetime.now(UTC)
    engine = create_engine(db_url.replace("+aiosqlite", ""))
    rows = [
        {
            "id": f"dev-{i:06d}",
            "hardware_profile": ("raspberry-pi-5", "jetson-orin", "x86-cpu")[i % 3],
            "agent_version": "1.0",
            "reported_labels": {"site": f"site-{i % 40}", "line": f"l{i % 7}"},
            "operator_labels": {"ring": "canary"} if i % 50 == 0 else {},
            "models": [{"model": "mlp", "version": 1 + i % 3, "sequence": 1}],
            "online": i % 2 == 0,
            "last_seen": now - timedelta(hours=2) if i % 4 == 2 else now,
            # silent: online, unheard for 2 h and no interval announced (limit: the timeout)
            "telemetry_interval_s": None if i % 4 == 2 else 3600.0,
            "trust_root_version": 1,
            "desired": {},
        }
        for i in range(devices)
    ]
    with engine.begin() as conn:
        for start in range(0, devices, 2000):
            conn.execute(insert(Device), rows[start : start + 2000])
    engine.dispose()


def timed(api: httpx.Client, path: str, loads: int, **params: Any) -> dict[str, float]:
    api.get(path, params=params).raise_for_status()  # warm-up
    times, size = [], 0
    for _ in range(loads):
        t0 = time.perf_counter()
        resp = api.get(path, params=params)
        times.append(time.perf_counter() - t0)
        resp.raise_for_status()
        size = len(resp.content)
    return {"ms": round(statistics.median(times) * 1e3, 1), "bytes": size}


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with ExitStack() as stack_:
        mqtt_port, cp_port = stack.free_port(), stack.free_port()
        logs = workdir / "logs"
        logs.mkdir()
        stack_.enter_context(
            stack.process(stack.mosquitto_args(workdir, mqtt_port), logs / "mosquitto.out")
        )
        stack.wait_for("the broker", lambda: stack.port_open(mqtt_port), 20)
        config = stack.control_plane_config(workdir, mqtt_port, cp_port, db_url=args.postgresql)
        with config.open("a") as f:
            f.write("presence_timeout_s = 1.0\n")  # silence is told after 6 s of hearing
        exe = str(Path(sys.executable).parent / "edgefleet")
        stack_.enter_context(
            stack.process([exe, "control-plane", "--config", str(config)], logs / "cp.log")
        )
        health = functools.partial(httpx.get, f"http://127.0.0.1:{cp_port}/health", timeout=5)
        stack.wait_for("the control plane", lambda: health().status_code == 200, 120)
        db_url = args.postgresql or f"sqlite+aiosqlite:///{workdir}/control-plane/edgefleet.db"
        fill(db_url, args.devices)
        time.sleep(7)
        api = stack_.enter_context(stack.admin_client(workdir, cp_port))
        middle = f"dev-{args.devices // 2:06d}"
        out = {
            "devices": args.devices,
            "database": "postgresql" if args.postgresql else "sqlite",
            "every_device": timed(api, "/api/v1/devices", args.loads),
            "first_page_100": timed(api, "/api/v1/devices", args.loads, limit=100),
            "middle_page_100": timed(api, "/api/v1/devices", args.loads, limit=100, after=middle),
            "page_100_silent_site_2": timed(
                api,
                "/api/v1/devices",
                args.loads,
                limit=100,
                presence="silent",
                label="site=site-2",
            ),
            "summary": timed(api, "/api/v1/devices/summary", args.loads),
        }
        out["ratio_every_device_to_first_page"] = round(
            out["every_device"]["ms"] / out["first_page_100"]["ms"], 1
        )
        out["ratio_every_device_to_summary"] = round(
            out["every_device"]["ms"] / out["summary"]["ms"], 1
        )
        return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=20000)
    p.add_argument("--loads", type=int, default=5)
    p.add_argument("--postgresql", help="an empty PostgreSQL database's SQLAlchemy URL")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="device-pages-") as tmp:
        print(json.dumps(run(args, Path(tmp)), indent=2))


if __name__ == "__main__":
    main()
