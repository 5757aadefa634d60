"""The console with a simulated fleet (the fleet benchmark's broker, control plane and
simulator processes) and Debian's headless chromium:

    python -m benchmarks.console.bench --devices 5000 --out benchmarks/console/results.json

1. Render: the overview, the first page of the device list and the first device's page, each
   loaded ``--loads`` times after one warm-up load; the figure is the browser's own navigation
   timing (request start to the end of the load event: server, transfer, parse, scripts and
   styles), median per page. The goal is under 1 s at 5,000 devices.
2. CPU per ingested message: telemetry at each ``--rate-per-s`` for ``--phase-s``, then the store
   drains; the control plane's process CPU time over the stored messages. Phases alternate,
   without and with the telemetry page open (its server-sent events streaming), ``--pairs``
   times, so drift of a shared machine moves both; the figure is the ratio of the medians.
   The goal is under 1.05.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil
from playwright.sync_api import Page, expect, sync_playwright

from benchmarks.fleet import phases
from benchmarks.fleet.measure import Fleet, start_fleet

CHROMIUM = "/usr/bin/chromium"


def login(page: Page, base: str, token: str) -> None:
    page.goto(base + "/ui/login")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(base + "/ui/")


def load_ms(page: Page, url: str) -> dict[str, float]:
    page.goto(url, wait_until="load")
    nav: dict[str, float] = page.evaluate(
        "(() => performance.getEntriesByType('navigation')[0].toJSON())()"
    )
    return {
        "server_ms": nav["responseStart"] - nav["requestStart"],
        "load_ms": nav["loadEventEnd"] - nav["startTime"],
        "bytes": nav["transferSize"],
    }


def render(page: Page, base: str, first_device: str, loads: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, path in (
        ("overview", "/ui/"),
        ("device list, first page", "/ui/devices"),
        ("first device", f"/ui/devices/{first_device}"),
    ):
        load_ms(page, base + path)  # warm-up
        runs = [load_ms(page, base + path) for _ in range(loads)]
        out[name] = {
            "load_ms_median": round(statistics.median(r["load_ms"] for r in runs), 1),
            "load_ms_max": round(max(r["load_ms"] for r in runs), 1),
            "server_ms_median": round(statistics.median(r["server_ms"] for r in runs), 1),
            "bytes": runs[-1]["bytes"],
        }
        print(f"  {name}: {out[name]}", flush=True)
    return out


def ingest_phase(fleet: Fleet, cp: psutil.Process, rate_per_s: float, phase_s: float) -> float:
    """Control-plane CPU seconds per stored telemetry message over one phase."""
    fleet.set_rate(0)
    rows0, _ = phases.settle(fleet)
    t = cp.cpu_times()
    cpu0 = t.user + t.system
    fleet.set_rate(rate_per_s)
    time.sleep(phase_s)
    fleet.set_rate(0)
    rows1, _ = phases.settle(fleet)
    t = cp.cpu_times()
    return (t.user + t.system - cpu0) / max(1, rows1 - rows0)


def cpu_overhead(
    fleet: Fleet,
    cp: psutil.Process,
    page: Page,
    base: str,
    rate_per_s: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    without, with_page, opening = [], [], []
    for i in range(args.pairs):
        page.goto(base + "/ui/login")  # no console page streaming
        without.append(ingest_phase(fleet, cp, rate_per_s, args.phase_s))
        # opening the page (its device list and the hour's history) is a one-off cost, counted
        # apart; the phase measures the stream that goes on while the page stays open
        t = cp.cpu_times()
        cpu0 = t.user + t.system
        page.goto(base + "/ui/telemetry")
        for latest in page.locator(".latest").all():  # every chart has its first point
            expect(latest).to_contain_text("req/s", timeout=60_000)
        t = cp.cpu_times()
        opening.append(t.user + t.system - cpu0)
        with_page.append(ingest_phase(fleet, cp, rate_per_s, args.phase_s))
        print(
            f"  {rate_per_s:.0f} msg/s, pair {i + 1}: {without[-1] * 1e6:.1f} us/msg without "
            f"the console, {with_page[-1] * 1e6:.1f} with the telemetry page streaming "
            f"(opening it: {opening[-1]:.2f} CPU s)",
            flush=True,
        )
    page.goto(base + "/ui/login")
    a, b = statistics.median(without), statistics.median(with_page)
    return {
        "rate_per_s": rate_per_s,
        "phase_s": args.phase_s,
        "page_open_cpu_s": [round(x, 3) for x in opening],
        "cpu_us_per_msg_without": [round(x * 1e6, 2) for x in without],
        "cpu_us_per_msg_with_page": [round(x * 1e6, 2) for x in with_page],
        "ratio_of_medians": round(b / a, 3),
    }


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with ExitStack() as stack:
        print(f"starting {args.devices} simulated devices (work dir {workdir})", flush=True)
        fleet = start_fleet(
            stack, workdir, args.devices, sim_procs=args.sim_procs, interval_s=3600.0
        )
        # a rollout to every device and a fleet-wide rollback: rollouts of 5,000 device rows
        # in the lists the overview reads, as a real fleet has
        phases.rollout_and_rollback(fleet, 2, 600)
        base = str(fleet.api.base_url).rstrip("/")
        token = fleet.api.headers["authorization"].split(" ", 1)[1]
        cp = psutil.Process(fleet.monitor.procs["control_plane"][0].pid)
        first = fleet.api.get("/api/v1/devices").json()[0]["id"]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
            login(page, base, token)
            result = {"devices": args.devices, "render": render(page, base, first, args.loads)}
            result["cpu_per_message"] = [
                cpu_overhead(fleet, cp, page, base, rate, args) for rate in args.rate_per_s
            ]
            browser.close()
        return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=5000)
    p.add_argument("--sim-procs", type=int, default=2)
    p.add_argument("--loads", type=int, default=5, help="timed loads per page")
    p.add_argument(
        "--rate-per-s",
        type=float,
        nargs="+",
        default=[500.0, 5000.0],
        help="telemetry rates (500: 5,000 devices at the agents' default 10 s interval)",
    )
    p.add_argument("--phase-s", type=float, default=20.0)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="console-bench-") as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
