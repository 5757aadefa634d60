"""The console with a simulated fleet (the fleet benchmark's broker, control plane and
simulator processes) and Debian's headless chromium:

    python -m benchmarks.console.bench --devices 5000 --out benchmarks/console/results.json

1. Render: the overview, the first page of the device list and the first device's page, each
   loaded ``--loads`` times after one warm-up load; the figure is the browser's own navigation
   timing (request start to the end of the load event: server, transfer, parse, scripts and
   styles), median per page. The goal is under 1 s at 5,000 devices.
2. What an open telemetry page adds to the control plane's CPU per ingested message. Its live
   points cost the same at any message rate, so they are measured apart, with no telemetry
   coming in: the control plane's CPU a second without a console page and with ``--tabs``
   pages streaming, alternated ``--pairs`` times (``stream_cost``). Then the CPU per stored
   message at each ``--rate-per-s`` (``ingest_cost``: telemetry for ``--phase-s``, then the
   store drains). The share is one page's CPU a second over the CPU of a second of messages.
   The goal is under 5 %. (Comparing ingest phases with and without a page directly was
   tried first: at 500 msg/s the phases' own spread, about 15 %, hid the page.)
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


def cpu_s(cp: psutil.Process) -> float:
    t = cp.cpu_times()
    return float(t.user + t.system)


def open_telemetry(tab: Page, base: str) -> None:
    tab.goto(base + "/ui/telemetry")
    for latest in tab.locator(".latest").all():  # every chart has had a point
        expect(latest).to_contain_text("req/s", timeout=60_000)


def stream_cost(
    fleet: Fleet, cp: psutil.Process, tabs: list[Page], base: str, args: argparse.Namespace
) -> dict[str, Any]:
    """The control plane's CPU a second with no telemetry coming in, without a console page
    and with ``tabs`` telemetry pages streaming, alternated: one page's share of the
    difference is what an open page costs, whatever the fleet sends (its points cost the
    same at any message rate). Several tabs make the difference stand out of the noise."""
    fleet.set_rate(0)
    phases.settle(fleet)
    without, with_tabs, opening = [], [], []
    for i in range(args.pairs):
        for tab in tabs:
            tab.goto(base + "/ui/login")  # no console page streaming
        c0, t0 = cpu_s(cp), time.monotonic()
        time.sleep(args.idle_s)
        without.append((cpu_s(cp) - c0) / (time.monotonic() - t0))
        for tab in tabs:
            c0 = cpu_s(cp)
            open_telemetry(tab, base)
            opening.append(cpu_s(cp) - c0)
        c0, t0 = cpu_s(cp), time.monotonic()
        time.sleep(args.idle_s)
        with_tabs.append((cpu_s(cp) - c0) / (time.monotonic() - t0))
        print(
            f"  idle, pair {i + 1}: {without[-1] * 1e3:.1f} CPU ms/s without the console, "
            f"{with_tabs[-1] * 1e3:.1f} with {len(tabs)} telemetry pages streaming",
            flush=True,
        )
    for tab in tabs:
        tab.goto(base + "/ui/login")
    per_page = (statistics.median(with_tabs) - statistics.median(without)) / len(tabs)
    return {
        "tabs": len(tabs),
        "idle_s": args.idle_s,
        "cpu_ms_per_s_without": [round(x * 1e3, 2) for x in without],
        "cpu_ms_per_s_with_tabs": [round(x * 1e3, 2) for x in with_tabs],
        "page_cpu_ms_per_s": round(per_page * 1e3, 3),
        "page_open_cpu_s_median": round(statistics.median(opening), 3),
    }


def rollout_page_cost(
    fleet: Fleet, cp: psutil.Process, tabs: list[Page], base: str, args: argparse.Namespace
) -> dict[str, Any]:
    """As :func:`stream_cost`, for the page of an active (paused) rollout of every device: its
    progress refreshes every second, each time reading the rollout with its device rows."""
    resp = fleet.api.post(
        "/api/v1/rollouts",
        json={"model": "mlp", "version": 2, "waves": ["1", "100%"], "bake_time_s": 3600},
    )
    resp.raise_for_status()
    rollout_id = resp.json()["id"]
    fleet.api.post(f"/api/v1/rollouts/{rollout_id}/pause").raise_for_status()
    without, with_tabs = [], []
    try:
        for i in range(args.pairs):
            for tab in tabs:
                tab.goto(base + "/ui/login")
            c0, t0 = cpu_s(cp), time.monotonic()
            time.sleep(args.idle_s)
            without.append((cpu_s(cp) - c0) / (time.monotonic() - t0))
            for tab in tabs:
                tab.goto(f"{base}/ui/rollouts/{rollout_id}")
            c0, t0 = cpu_s(cp), time.monotonic()
            time.sleep(args.idle_s)
            with_tabs.append((cpu_s(cp) - c0) / (time.monotonic() - t0))
            print(
                f"  rollout page, pair {i + 1}: {without[-1] * 1e3:.1f} CPU ms/s without, "
                f"{with_tabs[-1] * 1e3:.1f} with {len(tabs)} pages of a {fleet.devices}-device "
                "rollout open",
                flush=True,
            )
    finally:
        for tab in tabs:
            tab.goto(base + "/ui/login")
        fleet.api.post(f"/api/v1/rollouts/{rollout_id}/abort").raise_for_status()
        fleet.wait_versions(1, 600)
    per_page = (statistics.median(with_tabs) - statistics.median(without)) / len(tabs)
    return {
        "tabs": len(tabs),
        "cpu_ms_per_s_without": [round(x * 1e3, 2) for x in without],
        "cpu_ms_per_s_with_tabs": [round(x * 1e3, 2) for x in with_tabs],
        "page_cpu_ms_per_s": round(per_page * 1e3, 3),
    }


def ingest_cost(
    fleet: Fleet, cp: psutil.Process, rate_per_s: float, args: argparse.Namespace
) -> dict[str, Any]:
    """Control-plane CPU per stored message at ``rate_per_s``, no console page open."""
    runs = [ingest_phase(fleet, cp, rate_per_s, args.phase_s) for _ in range(args.pairs)]
    print(f"  {rate_per_s:.0f} msg/s: {[round(r * 1e6, 1) for r in runs]} us/msg", flush=True)
    return {
        "rate_per_s": rate_per_s,
        "phase_s": args.phase_s,
        "cpu_us_per_msg": [round(r * 1e6, 2) for r in runs],
        "cpu_us_per_msg_median": round(statistics.median(runs) * 1e6, 2),
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
            tabs = [page]
            for _ in range(args.tabs - 1):
                tab = page.context.new_page()  # the same login session
                tabs.append(tab)
            stream = stream_cost(fleet, cp, tabs, base, args)
            result["stream"] = stream
            result["rollout_page"] = rollout_page_cost(fleet, cp, tabs, base, args)
            result["ingest"] = []
            for rate in args.rate_per_s:
                ingest = ingest_cost(fleet, cp, rate, args)
                # one open page's CPU a second, over the ingest's CPU for that second's messages
                share = (
                    stream["page_cpu_ms_per_s"]
                    / 1e3
                    / (rate * ingest["cpu_us_per_msg_median"] / 1e6)
                )
                ingest["page_adds_share"] = round(share, 4)
                print(f"  {rate:.0f} msg/s: one open telemetry page adds {share:.1%}", flush=True)
                result["ingest"].append(ingest)
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
    p.add_argument("--pairs", type=int, default=3, help="repetitions of each CPU phase")
    p.add_argument("--tabs", type=int, default=5, help="telemetry pages open at once")
    p.add_argument("--idle-s", type=float, default=20.0, help="length of an idle CPU phase")
    p.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="console-bench-") as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
