"""What is measured on a running fleet: a single-wave rollout, a fleet-wide rollback, and
telemetry ingest against the bare subscriber.

Times are ``time.monotonic()``, which is one clock for every process on this machine, so the
simulator's event times and the driver's API calls compare directly. Two views of "done":
the control plane's (its rollout table, read from SQLite) and the devices' (when the
simulator published the event)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from benchmarks.fleet.measure import BARE_PREFIX, Fleet
from benchmarks.fleet.stack import MODEL, wait_for

QUANTILE = 0.99


def _reached(fleet: Fleet, rollout_id: int, states: tuple[str, ...], n: int) -> bool:
    counts = fleet.db.rollout_states(rollout_id)
    return sum(counts.get(s, 0) for s in states) >= n


def _device_view(times: list[float], since: float, n: int) -> float | None:
    k = math.ceil(QUANTILE * n)
    return round(times[k - 1] - since, 3) if len(times) >= k else None


def rollout_and_rollback(fleet: Fleet, version: int, timeout_s: float) -> dict[str, Any]:
    """Roll ``version`` out to every device in one wave, then abort it: every device goes back.

    The bake time is long so the rollout is still running (baking) when it is aborted; the
    gates keep their defaults, so the control plane evaluates them from telemetry as it would.
    """
    n, target = fleet.devices, math.ceil(QUANTILE * fleet.devices)
    spec = {
        "model": MODEL,
        "version": version,
        "selector": {"fleet": "sim"},
        "waves": ["100%"],
        "bake_time_s": 3600,
        "device_timeout_s": 600,
        "gates": {"max_rejections": n},
    }
    phase = fleet.monitor.start_phase()
    t0 = time.monotonic()
    resp = fleet.api.post("/api/v1/rollouts", json=spec)
    resp.raise_for_status()
    created_s = time.monotonic() - t0
    rollout_id = int(resp.json()["id"])
    wait_for(
        "99 % committed", lambda: _reached(fleet, rollout_id, ("committed",), target), timeout_s
    )
    cp99 = time.monotonic() - t0
    wait_for("all committed", lambda: _reached(fleet, rollout_id, ("committed",), n), timeout_s)
    cp_all = time.monotonic() - t0
    out: dict[str, Any] = {
        "rollout_id": rollout_id,
        "rollout": {
            "api_call_s": round(created_s, 3),
            "to_99pct_committed_s": round(cp99, 3),
            "to_all_committed_s": round(cp_all, 3),
            "device_view_99pct_s": _device_view(fleet.marks("committed", t0), t0, n),
            "states": fleet.db.rollout_states(rollout_id),
            "resources": fleet.monitor.end_phase(phase),
        },
    }
    fleet.wait_versions(version, timeout_s)

    phase = fleet.monitor.start_phase()
    t1 = time.monotonic()
    fleet.api.post(f"/api/v1/rollouts/{rollout_id}/abort").raise_for_status()
    abort_s = time.monotonic() - t1
    wait_for("99 % reverted", lambda: _reached(fleet, rollout_id, ("reverted",), target), timeout_s)
    cp99 = time.monotonic() - t1
    wait_for(
        "the rollout rolled back",
        lambda: fleet.db.rollout_state(rollout_id) == "rolled_back",
        timeout_s,
    )
    done = time.monotonic() - t1
    out["rollback"] = {
        "api_call_s": round(abort_s, 3),
        "to_99pct_reverted_s": round(cp99, 3),
        "to_rolled_back_s": round(done, 3),
        "device_view_99pct_s": _device_view(fleet.marks("rolled_back", t1), t1, n),
        "states": fleet.db.rollout_states(rollout_id),
        "resources": fleet.monitor.end_phase(phase),
    }
    fleet.wait_versions(1, timeout_s)
    return out


def bare_rate(fleet: Fleet, duration_s: float) -> dict[str, Any]:
    """Every simulator publishes as fast as it can under another topic prefix, which only the
    bare subscriber reads: what Mosquitto delivers to one subscriber that does nothing else."""
    before_sent = fleet.stats()["sent"].get(BARE_PREFIX, 0)
    c0 = fleet.bare.ask("count")
    phase = fleet.monitor.start_phase()
    fleet.set_rate(None, BARE_PREFIX)
    time.sleep(duration_s)
    c1 = fleet.bare.ask("count")
    fleet.set_rate(0)
    resources = fleet.monitor.end_phase(phase)
    sent = fleet.stats()["sent"].get(BARE_PREFIX, 0) - before_sent
    # what the broker still holds for the subscriber arrives after the window; wait for it
    # (bounded), so the next phase starts quiet and anything never delivered is counted
    delivered, deadline = 0, time.monotonic() + 120
    while time.monotonic() < deadline:
        delivered = fleet.bare.ask("count")["received"] - c0["received"]
        if delivered >= sent:
            break
        time.sleep(0.5)
    return {
        "delivered_per_s": round((c1["received"] - c0["received"]) / (c1["t"] - c0["t"]), 1),
        "sent_per_s": round(sent / (c1["t"] - c0["t"]), 1),
        "sent": sent,
        "delivered": delivered,
        "drain_s": round(time.monotonic() - c1["t"], 2),
        "resources": resources,
    }


def _totals(fleet: Fleet) -> tuple[int, int]:
    """(telemetry rows stored, telemetry messages sent) over the whole run: the database
    holds only this run's telemetry, so the two are equal when nothing is lost."""
    sent = fleet.stats()["sent"].get("edgefleet", 0)
    return fleet.stored_telemetry(), sent


def settle(fleet: Fleet, timeout_s: float = 120) -> tuple[int, int]:
    """With telemetry stopped, wait until every message sent so far is stored, or, if some
    never will be, until the count stops moving for 5 s; return the totals."""
    last, since = _totals(fleet), time.monotonic()
    deadline = time.monotonic() + timeout_s
    while last[0] != last[1] and time.monotonic() < deadline:
        time.sleep(0.5)
        now = _totals(fleet)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > 5.0:
            break
    return last


def ingest_step(
    fleet: Fleet, rate_per_s: float, duration_s: float, drain_s: float
) -> dict[str, Any]:
    """Offer ``rate_per_s`` telemetry messages for ``duration_s``; the step passes when every
    message sent in the whole run is stored within ``drain_s`` after the last one (the
    control plane kept up, nothing lost)."""
    fleet.set_rate(0)
    rows0, sent0 = settle(fleet)
    phase = fleet.monitor.start_phase()
    t0 = time.monotonic()
    fleet.set_rate(rate_per_s)
    time.sleep(duration_s)
    fleet.set_rate(0)
    t_end = time.monotonic()
    rows_at_end = fleet.stored_telemetry() - rows0
    resources = fleet.monitor.end_phase(phase)
    stored, sent = _totals(fleet)
    deadline = time.monotonic() + max(30.0, 2 * duration_s)
    while stored < sent and time.monotonic() < deadline:
        time.sleep(0.1)
        stored, sent = _totals(fleet)
    drained_s = time.monotonic() - t_end
    return {
        "offered_per_s": rate_per_s,
        "sent_per_s": round((sent - sent0) / (t_end - t0), 1),
        "stored_per_s_during": round(rows_at_end / (t_end - t0), 1),
        "sent": sent - sent0,
        "stored": stored - rows0,
        "lost_in_run": sent - stored,
        "drain_s": round(drained_s, 2),
        "passed": stored == sent and drained_s <= drain_s,
        "resources": resources,
    }


def ingest_sweep(
    fleet: Fleet,
    start_per_s: float,
    factor: float,
    ceiling_per_s: float,
    duration_s: float,
    refine: int = 2,
    measure: Callable[..., dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Raise the offered rate by ``factor`` until a step fails (or the ceiling is passed), then
    halve the gap between the last step that passed and the one that failed ``refine`` times:
    a coarse step alone would understate the limit by up to ``factor``. ``measure`` runs one
    step (default :func:`ingest_step`; a test gives a stand-in to check the search alone)."""
    measure = measure or ingest_step
    steps: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    failed: float | None = None
    rate = start_per_s
    while rate <= ceiling_per_s * 1.01:
        step = measure(fleet, rate, duration_s, drain_s=max(2.0, 0.2 * duration_s))
        steps.append(step)
        if not step["passed"]:
            failed = rate
            break
        best = step
        rate = round(rate * factor)
    for _ in range(refine):
        if best is None or failed is None:
            break
        rate = round((best["offered_per_s"] + failed) / 2)
        step = measure(fleet, rate, duration_s, drain_s=max(2.0, 0.2 * duration_s))
        steps.append(step)
        if step["passed"]:
            best = step
        else:
            failed = rate
    return {
        "steps": steps,
        "max_lossless_per_s": best["sent_per_s"] if best else None,
        "peak_stored_per_s": max(s["stored_per_s_during"] for s in steps),
    }
